//! The mock provider's books: every charge, authorization and refund, the idempotency keys of
//! every write, and the state machine that moves them. Pure state, no HTTP and no clock of its
//! own: every operation is given `now`, and what reached a final state is left in
//! [`Ledger::take_events`] for the caller to send as webhooks.
//!
//! Time-driven changes (a pending charge or refund settling, an authorization expiring) happen
//! in [`Ledger::advance_due`] on time, and lazily whenever the object is read, whichever comes
//! first; either way they happen once and emit their event once.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::time::Duration;

use actix_web::http::StatusCode;
use chrono::{DateTime, Utc};
use rust_decimal::Decimal;
use serde_json::{Value, json};
use uuid::Uuid;

use super::Faults;
use crate::clock;
use crate::money::{Amount, Currency};
use crate::provider::wire::{
    CaptureChargeBody, ChargeBody, CreateChargeBody, CreateRefundBody, ErrorBody, ErrorDetail, EventObject,
    RefundBody, charge_status, event_type, refund_status,
};

/// What the HTTP layer sends back: an object (or an error) and whether to hold the answer past
/// the client's timeout first (the operation itself has happened).
#[derive(Debug, Clone)]
pub(super) struct Reply {
    pub status: StatusCode,
    pub body: Value,
    pub hold: bool,
}

impl Reply {
    fn new(status: StatusCode, body: impl serde::Serialize, hold: bool) -> Reply {
        // Our own wire types always serialise; `Null` would only show a bug, never panic.
        Reply { status, body: serde_json::to_value(body).unwrap_or(Value::Null), hold }
    }

    pub fn error(status: StatusCode, kind: &str, code: Option<&str>, message: &str) -> Reply {
        let error =
            ErrorDetail { kind: kind.to_owned(), code: code.map(str::to_owned), message: message.to_owned() };
        Reply::new(status, ErrorBody { error }, false)
    }

    fn invalid(message: &str) -> Reply {
        Reply::error(StatusCode::BAD_REQUEST, "invalid_request", None, message)
    }

    fn missing(what: &str) -> Reply {
        Reply::error(
            StatusCode::NOT_FOUND,
            "invalid_request",
            Some("resource_missing"),
            &format!("no such {what}"),
        )
    }

    fn key_reused() -> Reply {
        Reply::error(
            StatusCode::UNPROCESSABLE_ENTITY,
            "idempotency_error",
            None,
            "this Idempotency-Key was used with different parameters",
        )
    }
}

/// A definite refusal, stored under its idempotency key and replayed like a success.
fn refusal(status: StatusCode, kind: &str, code: &str, message: &str) -> Reply {
    Reply::error(status, kind, Some(code), message)
}

/// An event to send: its type and the object as its `GET` returns it at this moment.
#[derive(Debug, Clone)]
pub(super) struct Emitted {
    pub kind: &'static str,
    pub object: EventObject,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum ChargeState {
    Pending,
    Succeeded,
    RequiresCapture,
    Declined { code: String, message: String },
    Canceled { reason: String },
}

struct StoredCharge {
    id: String,
    key: String,
    request: CreateChargeBody,
    currency: Currency,
    amount: Decimal,
    state: ChargeState,
    /// When a `Pending` charge settles.
    settles_at: Option<DateTime<Utc>>,
    authorization_expires_at: Option<DateTime<Utc>>,
    amount_captured: Decimal,
    /// Succeeded and pending refunds.
    amount_refunded: Decimal,
    created_at: DateTime<Utc>,
    /// The `X-Request-Id` of the request that created it.
    request_id: Option<String>,
    /// `POST /v1/charges` requests received for its key (the first and every replay).
    requests: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum RefundState {
    Pending,
    Succeeded,
    Failed { code: String, message: String },
}

struct StoredRefund {
    id: String,
    key: String,
    charge: usize,
    amount: Decimal,
    state: RefundState,
    settles_at: Option<DateTime<Utc>>,
    /// When a succeeded refund is reversed (`pm_refund_reversed`): it fails after all.
    reverses_at: Option<DateTime<Utc>>,
    reference: String,
    created_at: DateTime<Utc>,
    request_id: Option<String>,
    requests: u32,
}

/// A write other than a charge, by its idempotency key: what was asked (a replay must ask the
/// same) and what came of it.
struct Operation {
    request: OperationRequest,
    outcome: Outcome,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum OperationRequest {
    Capture { charge: String, body: CaptureChargeBody },
    Cancel { charge: String },
    Refund(CreateRefundBody),
}

enum Outcome {
    /// Replayed as the charge as it is now.
    Charge(usize),
    /// Replayed as the refund as it is now.
    Refund(usize),
    /// A business refusal, replayed as it was.
    Refused(Reply),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Due {
    Charge(usize),
    Refund(usize),
}

/// Timing the ledger needs from the settings.
#[derive(Debug, Clone, Copy)]
pub(super) struct Timing {
    pub settle_after: Duration,
    pub auth_ttl: Duration,
}

pub(super) struct Ledger {
    timing: Timing,
    charges: Vec<StoredCharge>,
    charge_by_key: HashMap<String, usize>,
    charge_by_id: HashMap<String, usize>,
    refunds: Vec<StoredRefund>,
    refund_by_id: HashMap<String, usize>,
    /// Captures, cancels and refunds share one key space, as at Stripe: reusing a capture's key
    /// for a refund is a 422, not a second operation.
    operations: HashMap<String, Operation>,
    /// Every instant at which something changes by itself, earliest first. An entry whose object
    /// was already moved by a read is a no-op when it comes up.
    due: BinaryHeap<Reverse<(DateTime<Utc>, Due)>>,
    /// Set when `due` gained an entry, so that the task settling things on time looks again.
    pub scheduled: bool,
    events: Vec<Emitted>,
    pub faults: Faults,
}

/// `value` printed with exactly the currency's minor units, as everywhere on the wire.
fn money(value: Decimal, currency: Currency) -> String {
    let mut value = value;
    value.rescale(currency.minor_units());
    value.to_string()
}

fn new_id(prefix: &str) -> String {
    format!("{prefix}_{}", Uuid::now_v7().simple())
}

/// Parses a positive amount in `currency` (exact, within its minor units).
fn positive_amount(text: &str, currency: Currency) -> Result<Decimal, Reply> {
    match Amount::parse(text, currency) {
        Ok(amount) if amount.value() > Decimal::ZERO => Ok(amount.value()),
        Ok(_) => Err(Reply::invalid("amount must be positive")),
        Err(error) => Err(Reply::invalid(&format!("amount {text:?}: {error}"))),
    }
}

fn same_currency(given: Option<&str>, currency: Currency) -> Result<(), Reply> {
    match given.map(Currency::parse) {
        None => Ok(()),
        Some(Ok(given)) if given == currency => Ok(()),
        Some(_) => Err(Reply::invalid(&format!("currency must be the charge's, {currency}"))),
    }
}

impl StoredCharge {
    fn body(&self) -> ChargeBody {
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
    pub fn new(timing: Timing) -> Ledger {
        Ledger {
            timing,
            charges: Vec::new(),
            charge_by_key: HashMap::new(),
            charge_by_id: HashMap::new(),
            refunds: Vec::new(),
            refund_by_id: HashMap::new(),
            operations: HashMap::new(),
            due: BinaryHeap::new(),
            scheduled: false,
            events: Vec::new(),
            faults: Faults::default(),
        }
    }

    /// Events of the changes made since the last call, in the order they happened.
    pub fn take_events(&mut self) -> Vec<Emitted> {
        std::mem::take(&mut self.events)
    }

    fn schedule(&mut self, at: DateTime<Utc>, due: Due) {
        self.due.push(Reverse((at, due)));
        self.scheduled = true;
    }

    fn emit_charge(&mut self, kind: &'static str, index: usize) {
        let object = EventObject::Charge(self.charges[index].body());
        self.events.push(Emitted { kind, object });
    }

    fn emit_refund(&mut self, kind: &'static str, index: usize) {
        let object = EventObject::Refund(self.refund_body(index));
        self.events.push(Emitted { kind, object });
    }

    /// Makes every change due by `now`; returns when the next one is due.
    pub fn advance_due(&mut self, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
        while let Some(Reverse((at, due))) = self.due.peek().copied() {
            if at > now {
                return Some(at);
            }
            self.due.pop();
            match due {
                Due::Charge(index) => self.advance_charge(index, now),
                Due::Refund(index) => self.advance_refund(index, now),
            }
        }
        None
    }

    /// Moves a charge through every change due by `now`: a pending charge settles (captured or
    /// authorized), an authorization past its expiry is canceled. Both may happen in one call
    /// when nobody looked for a while; each emits its own event, in order.
    fn advance_charge(&mut self, index: usize, now: DateTime<Utc>) {
        loop {
            let charge = &mut self.charges[index];
            match charge.state {
                ChargeState::Pending if charge.settles_at.is_some_and(|at| at <= now) => {
                    let settled_at = charge.settles_at.take().unwrap_or(now);
                    if charge.request.capture {
                        charge.state = ChargeState::Succeeded;
                        charge.amount_captured = charge.amount;
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
                _ => return,
            }
        }
    }

    fn advance_refund(&mut self, index: usize, now: DateTime<Utc>) {
        let refund = &mut self.refunds[index];
        if refund.state == RefundState::Pending && refund.settles_at.is_some_and(|at| at <= now) {
            refund.state = RefundState::Succeeded;
            refund.settles_at = None;
            self.emit_refund(event_type::REFUND_SUCCEEDED, index);
        }
        let refund = &mut self.refunds[index];
        if refund.state == RefundState::Succeeded && refund.reverses_at.is_some_and(|at| at <= now) {
            refund.state = RefundState::Failed {
                code: "refund_reversed".to_owned(),
                message: "The refund was reversed: the card could not receive it.".to_owned(),
            };
            refund.reverses_at = None;
            let (charge, amount) = (refund.charge, refund.amount);
            self.charges[charge].amount_refunded -= amount;
            self.emit_refund(event_type::REFUND_FAILED, index);
        }
    }

    fn charge_view(&mut self, index: usize, now: DateTime<Utc>) -> ChargeBody {
        self.advance_charge(index, now);
        self.charges[index].body()
    }

    fn refund_body(&self, index: usize) -> RefundBody {
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

    fn refund_view(&mut self, index: usize, now: DateTime<Utc>) -> RefundBody {
        self.advance_refund(index, now);
        self.refund_body(index)
    }

    pub fn charge_by_key(&mut self, key: &str, now: DateTime<Utc>) -> Option<ChargeBody> {
        let index = self.charge_by_key.get(key).copied()?;
        Some(self.charge_view(index, now))
    }

    pub fn charge_by_id(&mut self, id: &str, now: DateTime<Utc>) -> Option<ChargeBody> {
        let index = self.charge_by_id.get(id).copied()?;
        Some(self.charge_view(index, now))
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
            "pm_provider_down" => {
                return Reply::error(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "api_error",
                    None,
                    "the provider is down",
                );
            }
            "pm_card_ok" | "pm_refund_declined" | "pm_refund_pending" | "pm_refund_timeout"
            | "pm_refund_reversed" => (settled, hold_fault),
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
            created_at: now,
            request_id,
            requests: 1,
        };
        let event = match charge.state {
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
        self.charges.push(charge);
        if let Some(kind) = event {
            self.emit_charge(kind, index);
        }
        Reply::new(StatusCode::CREATED, self.charges[index].body(), hold)
    }

    /// The answer for a key already used by a capture, cancel or refund: the same outcome for
    /// the same request, 422 for another.
    fn replay(&mut self, key: &str, request: &OperationRequest, now: DateTime<Utc>) -> Option<Reply> {
        let operation = self.operations.get(key)?;
        if operation.request != *request {
            return Some(Reply::key_reused());
        }
        // A replay answers at once, whatever the first request did.
        Some(match &operation.outcome {
            Outcome::Charge(index) => {
                let index = *index;
                Reply::new(StatusCode::OK, self.charge_view(index, now), false)
            }
            Outcome::Refund(index) => {
                let index = *index;
                self.refunds[index].requests += 1;
                Reply::new(StatusCode::OK, self.refund_view(index, now), false)
            }
            Outcome::Refused(reply) => reply.clone(),
        })
    }

    fn record(&mut self, key: &str, request: OperationRequest, outcome: Outcome) {
        self.operations.insert(key.to_owned(), Operation { request, outcome });
    }

    /// Stores a refusal under its key (so a retry gets the same answer) and returns it.
    fn refuse(&mut self, key: &str, request: OperationRequest, reply: Reply) -> Reply {
        self.record(key, request, Outcome::Refused(reply.clone()));
        reply
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
            ChargeState::RequiresCapture if charge.request.payment_method == "pm_capture_declined" => {
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
            return self.refuse(key, request, reply);
        }
        let charge = &mut self.charges[index];
        charge.state = ChargeState::Succeeded;
        // A partial capture releases the rest of the authorization.
        charge.amount_captured = amount.unwrap_or(charge.amount);
        self.record(key, request, Outcome::Charge(index));
        self.emit_charge(event_type::CHARGE_CAPTURED, index);
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
        let remaining = charge.amount_captured - charge.amount_refunded;
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
            "pm_refund_declined" => (
                RefundState::Failed {
                    code: "refund_declined".to_owned(),
                    message: "The refund was declined.".to_owned(),
                },
                false,
                Some(event_type::REFUND_FAILED),
            ),
            "pm_refund_pending" => (RefundState::Pending, hold_fault, None),
            "pm_refund_timeout" => (RefundState::Succeeded, true, Some(event_type::REFUND_SUCCEEDED)),
            _ => (RefundState::Succeeded, hold_fault, Some(event_type::REFUND_SUCCEEDED)),
        };
        let index = self.refunds.len();
        let settles_at = (state == RefundState::Pending).then(|| clock::after(now, self.timing.settle_after));
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
        if let Some(kind) = event {
            self.emit_refund(kind, index);
        }
        Reply::new(StatusCode::CREATED, self.refund_body(index), hold)
    }

    /// `GET /_admin/charges`: every charge, oldest first, with what the mock knows about it.
    pub fn admin_charges(&mut self, now: DateTime<Utc>) -> Vec<Value> {
        (0..self.charges.len())
            .map(|index| {
                let body = self.charge_view(index, now);
                let stored = &self.charges[index];
                json!({
                    "request_id": stored.request_id,
                    "requests": stored.requests,
                    "id": body.id,
                    "idempotency_key": body.idempotency_key,
                    "amount": body.amount,
                    "currency": body.currency,
                    "status": body.status,
                    "capture": stored.request.capture,
                    "captured": body.captured,
                    "amount_captured": body.amount_captured,
                    "amount_refunded": body.amount_refunded,
                    "authorization_expires_at": body.authorization_expires_at,
                    "cancellation_reason": body.cancellation_reason,
                    "decline_code": body.decline_code,
                    "payment_method": body.payment_method,
                    "reference": body.reference,
                    "created_at": body.created_at,
                })
            })
            .collect()
    }

    /// `GET /_admin/refunds`: every refund, oldest first.
    pub fn admin_refunds(&mut self, now: DateTime<Utc>) -> Vec<Value> {
        (0..self.refunds.len())
            .map(|index| {
                let body = self.refund_view(index, now);
                let stored = &self.refunds[index];
                json!({
                    "request_id": stored.request_id,
                    "requests": stored.requests,
                    "id": body.id,
                    "charge": body.charge,
                    "idempotency_key": body.idempotency_key,
                    "amount": body.amount,
                    "currency": body.currency,
                    "status": body.status,
                    "failure_code": body.failure_code,
                    "reference": body.reference,
                    "created_at": body.created_at,
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ledger() -> Ledger {
        Ledger::new(Timing { settle_after: Duration::from_secs(3), auth_ttl: Duration::from_secs(60) })
    }

    fn charge(payment_method: &str, capture: bool) -> CreateChargeBody {
        CreateChargeBody {
            amount: "10.00".to_owned(),
            currency: "USD".to_owned(),
            payment_method: payment_method.to_owned(),
            reference: "ref".to_owned(),
            capture,
        }
    }

    fn refund(charge: &str, amount: &str) -> CreateRefundBody {
        CreateRefundBody {
            charge: charge.to_owned(),
            amount: amount.to_owned(),
            currency: None,
            reference: "ref".to_owned(),
        }
    }

    fn kinds(ledger: &mut Ledger) -> Vec<&'static str> {
        ledger.take_events().iter().map(|event| event.kind).collect()
    }

    #[test]
    fn a_pending_authorization_nobody_looked_at_settles_then_expires_with_both_events_in_order() {
        let mut ledger = ledger();
        let t0 = Utc::now();
        let reply = ledger.create_charge("k", charge("pm_provider_pending", false), None, t0, false);
        let id = reply.body["id"].as_str().unwrap().to_owned();
        assert_eq!(reply.body["status"], "pending");
        assert!(kinds(&mut ledger).is_empty());
        assert!(std::mem::take(&mut ledger.scheduled));

        // Read long after both the settlement (3 s) and the expiry (60 s after settling).
        let late = t0 + chrono::Duration::seconds(120);
        let body = ledger.charge_by_id(&id, late).unwrap();
        assert_eq!(
            (body.status.as_str(), body.cancellation_reason.as_deref()),
            ("canceled", Some("authorization_expired"))
        );
        // The expiry runs from the authorization, not from the read.
        assert_eq!(body.authorization_expires_at, Some(t0 + chrono::Duration::seconds(63)));
        assert_eq!(kinds(&mut ledger), ["charge.succeeded", "charge.canceled"]);
        // Already moved by the read: the scheduled entries are no-ops.
        assert_eq!(ledger.advance_due(late), None);
        assert!(kinds(&mut ledger).is_empty());
    }

    #[test]
    fn advance_due_moves_things_on_time_and_says_when_next() {
        let mut ledger = ledger();
        let t0 = Utc::now();
        ledger.create_charge("a", charge("pm_card_ok", false), None, t0, false);
        ledger.create_charge("p", charge("pm_provider_pending", true), None, t0, false);
        assert_eq!(kinds(&mut ledger), ["charge.succeeded"], "the authorization, at once");
        assert_eq!(ledger.advance_due(t0), Some(t0 + chrono::Duration::seconds(3)));
        let next = ledger.advance_due(t0 + chrono::Duration::seconds(3));
        assert_eq!(kinds(&mut ledger), ["charge.succeeded"], "the pending charge");
        assert_eq!(next, Some(t0 + chrono::Duration::seconds(60)));
        assert_eq!(ledger.advance_due(t0 + chrono::Duration::seconds(60)), None);
        assert_eq!(kinds(&mut ledger), ["charge.canceled"], "the authorization expired");
    }

    #[test]
    fn refunds_never_exceed_the_captured_amount_and_failed_ones_do_not_count() {
        let mut ledger = ledger();
        let now = Utc::now();
        let id = ledger.create_charge("c", charge("pm_refund_pending", false), None, now, false).body["id"]
            .as_str()
            .unwrap()
            .to_owned();
        let partial = CaptureChargeBody { amount: Some("6.00".to_owned()), currency: None };
        assert_eq!(ledger.capture(&id, "cap", partial, now, false).body["amount_captured"], "6.00");
        let first = ledger.create_refund("r1", refund(&id, "4.00"), None, now, false);
        assert_eq!((first.status, first.body["status"].as_str()), (StatusCode::CREATED, Some("pending")));
        // 2.00 remain: the pending refund counts.
        let over = ledger.create_refund("r2", refund(&id, "2.01"), None, now, false);
        assert_eq!(
            (over.status, over.body["error"]["code"].as_str()),
            (StatusCode::BAD_REQUEST, Some("amount_too_large"))
        );
        assert_eq!(
            ledger.create_refund("r3", refund(&id, "2.00"), None, now, false).status,
            StatusCode::CREATED
        );
        let none_left = ledger.create_refund("r4", refund(&id, "0.01"), None, now, false);
        assert_eq!(none_left.body["error"]["code"], "charge_already_refunded");
        assert_eq!(ledger.charge_by_id(&id, now).unwrap().amount_refunded, "6.00");

        let declined =
            ledger.create_charge("d", charge("pm_refund_declined", true), None, now, false).body["id"]
                .as_str()
                .unwrap()
                .to_owned();
        let failed = ledger.create_refund("f1", refund(&declined, "10.00"), None, now, false);
        assert_eq!(failed.body["status"], "failed");
        assert_eq!(ledger.charge_by_id(&declined, now).unwrap().amount_refunded, "0.00");
        // The refusal and the failure are both answers for their keys, replayed as they were.
        assert_eq!(ledger.create_refund("r2", refund(&id, "2.01"), None, now, false).body, over.body);
        assert_eq!(
            ledger.create_refund("f1", refund(&declined, "10.00"), None, now, false).body,
            failed.body
        );
        assert!(ledger.refund_by_key("r2", now).is_none());
    }

    #[test]
    fn amounts_are_exact_and_in_the_currency_of_the_charge() {
        let mut ledger = ledger();
        let now = Utc::now();
        let mut yen = charge("pm_card_ok", true);
        (yen.amount, yen.currency) = ("1200".to_owned(), "JPY".to_owned());
        let id = ledger.create_charge("y", yen, None, now, false).body["id"].as_str().unwrap().to_owned();
        let fractional = ledger.create_refund("r1", refund(&id, "0.5"), None, now, false);
        assert_eq!(fractional.status, StatusCode::BAD_REQUEST);
        let mut wrong_currency = refund(&id, "100");
        wrong_currency.currency = Some("USD".to_owned());
        assert_eq!(
            ledger.create_refund("r2", wrong_currency, None, now, false).status,
            StatusCode::BAD_REQUEST
        );
        for bad in ["0", "-1", "1e400", "NaN", ""] {
            assert_eq!(
                ledger.create_refund("r3", refund(&id, bad), None, now, false).status,
                StatusCode::BAD_REQUEST
            );
        }
        let ok = ledger.create_refund("r4", refund(&id, "1199"), None, now, false);
        assert_eq!((ok.body["amount"].as_str(), ok.body["currency"].as_str()), (Some("1199"), Some("JPY")));
        let mut bad_charge = charge("pm_card_ok", true);
        bad_charge.amount = "1.001".to_owned();
        assert_eq!(ledger.create_charge("b", bad_charge, None, now, false).status, StatusCode::BAD_REQUEST);
    }
}
