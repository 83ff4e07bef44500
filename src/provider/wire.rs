//! The provider's JSON, shared by the client and the mock so that they cannot drift apart, and
//! its translation into the domain types of [`super`]. Money is always an exact decimal string
//! (`"12.50"`), never a JSON number, so no float ever touches an amount.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::event::{self, Event, Object};
use super::{BalanceTransaction, Charge, ChargeStatus, Dispute, ProviderError, Refund, RefundStatus};
use crate::disputes::{ClosedReason, DisputeStatus};
use crate::money::parse_value;
use crate::payments::payment_of_downstream_key;
use crate::refunds::refund_of_downstream_key;

/// Charge statuses on the wire.
pub mod charge_status {
    pub const SUCCEEDED: &str = "succeeded";
    pub const REQUIRES_CAPTURE: &str = "requires_capture";
    pub const PENDING: &str = "pending";
    pub const DECLINED: &str = "declined";
    pub const CANCELED: &str = "canceled";
}

/// Refund statuses on the wire.
pub mod refund_status {
    pub const SUCCEEDED: &str = "succeeded";
    pub const PENDING: &str = "pending";
    pub const FAILED: &str = "failed";
}

/// Dispute statuses on the wire, Stripe's: the `warning_*` ones are inquiries (no money moves),
/// the others chargebacks (the funds are withdrawn when the dispute opens).
pub mod dispute_status {
    pub const WARNING_NEEDS_RESPONSE: &str = "warning_needs_response";
    pub const WARNING_UNDER_REVIEW: &str = "warning_under_review";
    pub const WARNING_CLOSED: &str = "warning_closed";
    pub const NEEDS_RESPONSE: &str = "needs_response";
    pub const UNDER_REVIEW: &str = "under_review";
    pub const WON: &str = "won";
    pub const LOST: &str = "lost";
}

/// Why a dispute closed, on the wire.
pub mod dispute_closed_reason {
    /// The merchant accepted it (`POST /v1/disputes/{id}/close`).
    pub const ACCEPTED: &str = "accepted";
    /// Decided against the merchant, who never submitted evidence.
    pub const EVIDENCE_NOT_SUBMITTED: &str = "evidence_not_submitted";
    /// Decided by the card network after evidence was submitted (won or lost).
    pub const DECIDED: &str = "decided";
}

/// Webhook event types: each is sent when a charge or refund reaches a final state, or a
/// dispute moves.
pub mod event_type {
    /// A charge succeeded, or an authorization was granted (the charge then `requires_capture`).
    pub const CHARGE_SUCCEEDED: &str = "charge.succeeded";
    /// A charge was declined.
    pub const CHARGE_FAILED: &str = "charge.failed";
    /// An authorization was captured.
    pub const CHARGE_CAPTURED: &str = "charge.captured";
    /// An authorization was voided or expired.
    pub const CHARGE_CANCELED: &str = "charge.canceled";
    pub const REFUND_SUCCEEDED: &str = "refund.succeeded";
    pub const REFUND_FAILED: &str = "refund.failed";
    /// A dispute opened on a captured charge.
    pub const DISPUTE_CREATED: &str = "charge.dispute.created";
    /// A dispute's evidence or status changed.
    pub const DISPUTE_UPDATED: &str = "charge.dispute.updated";
    /// The disputed funds left the merchant's balance.
    pub const DISPUTE_FUNDS_WITHDRAWN: &str = "charge.dispute.funds_withdrawn";
    /// A won dispute's funds came back.
    pub const DISPUTE_FUNDS_REINSTATED: &str = "charge.dispute.funds_reinstated";
    /// A dispute reached its final status (`won`, `lost`, `warning_closed`).
    pub const DISPUTE_CLOSED: &str = "charge.dispute.closed";
}

/// What moved the money of a balance transaction (Stripe's `reporting_category`).
pub mod reporting_category {
    /// A charge captured: money in.
    pub const CHARGE: &str = "charge";
    /// A refund succeeded: money out.
    pub const REFUND: &str = "refund";
    /// A refund that had succeeded was reversed: the money came back.
    pub const REFUND_FAILURE: &str = "refund_failure";
    /// A dispute opened: the customer's bank took the funds.
    pub const DISPUTE: &str = "dispute";
    /// A dispute won: the funds came back.
    pub const DISPUTE_REVERSAL: &str = "dispute_reversal";
}

/// Error codes of business refusals: an answer about the money (nothing moved), as opposed to a
/// malformed request. A 402 is always one; a 400 or 409 is one when it carries one of these.
pub const REFUSAL_CODES: &[&str] = &[
    "authorization_expired",
    "capture_declined",
    "amount_too_large",
    "charge_already_captured",
    "charge_already_refunded",
    "charge_canceled",
    "charge_not_capturable",
    "charge_not_cancelable",
    "charge_not_refundable",
    "dispute_not_updatable",
    "dispute_not_closable",
];

fn yes() -> bool {
    true
}

/// `POST /v1/charges` body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateChargeBody {
    pub amount: String,
    pub currency: String,
    pub payment_method: String,
    pub reference: String,
    /// `false` authorizes only. Absent means `true`, as at Stripe.
    #[serde(default = "yes")]
    pub capture: bool,
}

/// A charge as the provider reports it (`GET /v1/charges/{id}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChargeBody {
    pub id: String,
    pub object: String,
    pub idempotency_key: String,
    /// Charged or authorized.
    pub amount: String,
    pub currency: String,
    /// `succeeded`, `requires_capture`, `pending`, `declined` or `canceled`.
    pub status: String,
    /// Whether money was captured (`succeeded` charges only).
    pub captured: bool,
    pub amount_captured: String,
    /// Succeeded and pending refunds.
    pub amount_refunded: String,
    pub payment_method: String,
    pub reference: String,
    pub decline_code: Option<String>,
    pub failure_message: Option<String>,
    /// `requested` or `authorization_expired`, for `canceled` charges.
    pub cancellation_reason: Option<String>,
    pub authorization_expires_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
}

/// `POST /v1/charges/{id}/capture` body; an empty body captures everything.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CaptureChargeBody {
    /// Up to the authorized amount; absent: all of it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub amount: Option<String>,
    /// When given, must be the charge's currency.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub currency: Option<String>,
}

/// `POST /v1/charges/{id}/cancel` body (empty, or `{}`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CancelChargeBody {}

/// `POST /v1/refunds` body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateRefundBody {
    /// The charge's id.
    pub charge: String,
    pub amount: String,
    /// When given, must be the charge's currency.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub currency: Option<String>,
    pub reference: String,
}

/// A refund as the provider reports it (`GET /v1/refunds/{id}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RefundBody {
    pub id: String,
    pub object: String,
    pub idempotency_key: String,
    pub charge: String,
    pub amount: String,
    pub currency: String,
    /// `succeeded`, `pending` or `failed`.
    pub status: String,
    pub reference: String,
    pub failure_code: Option<String>,
    pub failure_message: Option<String>,
    pub created_at: DateTime<Utc>,
}

/// A dispute as the provider reports it (`GET /v1/disputes/{id}`). Stripe's shape, with the
/// money moved spelled out (`amount_withdrawn`, `amount_reinstated`) instead of a list of
/// balance transactions, and why it closed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DisputeBody {
    pub id: String,
    pub object: String,
    /// The disputed charge's id.
    pub charge: String,
    /// What the customer's bank disputes (at most what was captured less what was refunded).
    pub amount: String,
    pub currency: String,
    /// `fraudulent`, `product_not_received`, `duplicate`, ... (the bank's word, kept as text).
    pub reason: String,
    /// One of [`dispute_status`].
    pub status: String,
    /// One of [`dispute_closed_reason`], once closed.
    pub closed_reason: Option<String>,
    /// Until when evidence is taken (open disputes).
    pub evidence_due_by: Option<DateTime<Utc>>,
    /// The evidence text given so far.
    pub evidence: Option<String>,
    /// How often evidence was submitted.
    pub submission_count: u32,
    /// What left the merchant's balance for it so far.
    pub amount_withdrawn: String,
    /// What came back (a won dispute).
    pub amount_reinstated: String,
    pub created_at: DateTime<Utc>,
}

/// `POST /v1/disputes/{id}` body: evidence text, and whether to submit it now.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpdateDisputeBody {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub evidence: Option<String>,
    /// `true` submits the evidence: the dispute goes under review.
    #[serde(default)]
    pub submit: bool,
}

/// `POST /v1/disputes/{id}/close` body (empty, or `{}`): the merchant accepts the dispute.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CloseDisputeBody {}

/// A movement of the merchant's money at the provider (`GET /v1/balance_transactions`), as
/// Stripe's balance transactions: `amount` is signed (negative when money left the balance).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BalanceTransactionBody {
    /// `txn_...`
    pub id: String,
    pub object: String,
    pub amount: String,
    pub currency: String,
    /// One of [`reporting_category`] (kept a string: a provider may report others).
    pub reporting_category: String,
    /// The charge, refund or dispute that moved the money.
    pub source: String,
    /// The idempotency key of the write that created the charge or refund (for a dispute, its
    /// charge's): how orderpay's operation is named without a lookup.
    pub source_idempotency_key: Option<String>,
    pub created: DateTime<Utc>,
}

/// A page of a list, newest first: `starting_after` the last id of a page gives the next.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListBody<T> {
    pub object: String,
    pub data: Vec<T>,
    pub has_more: bool,
}

/// An error answer: `{"error": {"type": ..., "code": ..., "message": ...}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorDetail {
    /// `invalid_request`, `card_error`, `idempotency_error`, `authentication_error`, ...
    #[serde(rename = "type")]
    pub kind: String,
    /// What exactly was refused, for refusals: one of [`REFUSAL_CODES`] and a few more.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    #[serde(default)]
    pub message: String,
}

/// A webhook event: `{id, type, created, data: {object}}`, the object exactly as its `GET`
/// returns it at the moment of the event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventBody {
    /// `evt_...`, also the `webhook-id` header: the same on every delivery attempt.
    pub id: String,
    /// One of [`event_type`] (kept a string: a receiver must tolerate types it does not know).
    #[serde(rename = "type")]
    pub kind: String,
    /// Unix seconds.
    pub created: i64,
    pub data: EventData,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventData {
    pub object: EventObject,
}

/// A charge, a refund or a dispute; told apart by their fields (a refund has no
/// `payment_method`, a charge no `charge`, a dispute no `idempotency_key`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum EventObject {
    Charge(ChargeBody),
    Refund(RefundBody),
    Dispute(DisputeBody),
}

fn money(field: &str, text: &str) -> Result<rust_decimal::Decimal, ProviderError> {
    parse_value(text).map_err(|error| ProviderError::Malformed(format!("{field} {text:?}: {error}")))
}

/// An amount that may be negative (a balance transaction's: money that left).
fn signed_money(field: &str, text: &str) -> Result<rust_decimal::Decimal, ProviderError> {
    match text.strip_prefix('-') {
        Some(magnitude) => money(field, magnitude).map(|value| -value),
        None => money(field, text),
    }
}

impl ChargeBody {
    /// The domain's view of this charge; an unknown status or a malformed amount is `Malformed`.
    pub fn to_charge(&self) -> Result<Charge, ProviderError> {
        let status = match self.status.as_str() {
            charge_status::SUCCEEDED => ChargeStatus::Succeeded,
            charge_status::REQUIRES_CAPTURE => ChargeStatus::RequiresCapture,
            charge_status::PENDING => ChargeStatus::Pending,
            charge_status::DECLINED => ChargeStatus::Declined {
                code: self.decline_code.clone().unwrap_or_else(|| "declined".to_owned()),
                message: self
                    .failure_message
                    .clone()
                    .unwrap_or_else(|| "the payment was declined".to_owned()),
            },
            charge_status::CANCELED => ChargeStatus::Canceled {
                reason: self.cancellation_reason.clone().unwrap_or_else(|| "canceled".to_owned()),
            },
            other => return Err(ProviderError::Malformed(format!("unknown charge status {other:?}"))),
        };
        Ok(Charge {
            id: self.id.clone(),
            status,
            currency: self.currency.clone(),
            amount: money("amount", &self.amount)?,
            amount_captured: money("amount_captured", &self.amount_captured)?,
            amount_refunded: money("amount_refunded", &self.amount_refunded)?,
            authorization_expires_at: self.authorization_expires_at,
        })
    }
}

impl RefundBody {
    /// The domain's view of this refund; an unknown status or a malformed amount is `Malformed`.
    pub fn to_refund(&self) -> Result<Refund, ProviderError> {
        let status = match self.status.as_str() {
            refund_status::SUCCEEDED => RefundStatus::Succeeded,
            refund_status::PENDING => RefundStatus::Pending,
            refund_status::FAILED => RefundStatus::Failed {
                code: self.failure_code.clone().unwrap_or_else(|| "refund_failed".to_owned()),
                message: self.failure_message.clone().unwrap_or_else(|| "the refund failed".to_owned()),
            },
            other => return Err(ProviderError::Malformed(format!("unknown refund status {other:?}"))),
        };
        Ok(Refund {
            id: self.id.clone(),
            charge_id: self.charge.clone(),
            status,
            currency: self.currency.clone(),
            amount: money("amount", &self.amount)?,
        })
    }
}

impl DisputeBody {
    /// The domain's view of this dispute; an unknown status or a malformed amount is `Malformed`.
    pub fn to_dispute(&self) -> Result<Dispute, ProviderError> {
        let status = DisputeStatus::parse(&self.status)
            .ok_or_else(|| ProviderError::Malformed(format!("unknown dispute status {:?}", self.status)))?;
        let closed_reason = self
            .closed_reason
            .as_deref()
            .map(|reason| {
                ClosedReason::parse(reason)
                    .ok_or_else(|| ProviderError::Malformed(format!("unknown closed reason {reason:?}")))
            })
            .transpose()?;
        if status.is_final() != closed_reason.is_some() {
            return Err(ProviderError::Malformed(format!(
                "a {status} dispute with closed reason {closed_reason:?}"
            )));
        }
        Ok(Dispute {
            id: self.id.clone(),
            charge_id: self.charge.clone(),
            amount: money("amount", &self.amount)?,
            currency: self.currency.clone(),
            reason: self.reason.clone(),
            status,
            closed_reason,
            closed_reason_inferred: false,
            evidence_due_by: self.evidence_due_by,
            evidence: self.evidence.clone(),
            submission_count: self.submission_count,
            amount_withdrawn: money("amount_withdrawn", &self.amount_withdrawn)?,
            amount_reinstated: money("amount_reinstated", &self.amount_reinstated)?,
            created_at: self.created_at,
        })
    }
}

impl BalanceTransactionBody {
    /// The domain's view of this movement; a malformed amount is `Malformed`.
    pub fn to_balance_transaction(&self) -> Result<BalanceTransaction, ProviderError> {
        Ok(BalanceTransaction {
            id: self.id.clone(),
            category: self.reporting_category.clone(),
            amount: signed_money("amount", &self.amount)?,
            currency: self.currency.clone(),
            source: self.source.clone(),
            source_key: self.source_idempotency_key.clone(),
            created: self.created,
        })
    }
}

/// The envelope of an event as `read_event` takes it: the object is read by the type.
#[derive(Deserialize)]
struct Envelope {
    #[serde(rename = "type")]
    kind: String,
    data: EnvelopeData,
}

#[derive(Deserialize)]
struct EnvelopeData {
    object: serde_json::Value,
}

/// Reads a verified event of the mock's wire, `{id, type, created, data: {object}}` (`id` is the
/// `webhook-id` it was signed with): the object of a type we act on must be a charge, a refund or
/// a dispute as the provider reports them, and names our payment or refund by the downstream key
/// it was made with. `Err` says what is wrong (the provider's format changed: a person must
/// look; its retries change nothing).
pub fn read_event(id: String, body: serde_json::Value) -> Result<Event, String> {
    let envelope: Envelope =
        serde_json::from_value(body).map_err(|error| format!("not a webhook event: {error}"))?;
    event::check_text("type", &envelope.kind)?;
    let object = envelope.data.object;
    let object = match envelope.kind.as_str() {
        event_type::CHARGE_SUCCEEDED
        | event_type::CHARGE_FAILED
        | event_type::CHARGE_CAPTURED
        | event_type::CHARGE_CANCELED => {
            let body: ChargeBody = serde_json::from_value(object)
                .map_err(|error| format!("data.object is not a charge: {error}"))?;
            let charge = body.to_charge().map_err(|error| format!("data.object: {error}"))?;
            Object::Charge { payment: payment_of_downstream_key(&body.idempotency_key), id: body.id, charge }
        }
        event_type::REFUND_SUCCEEDED | event_type::REFUND_FAILED => {
            let body: RefundBody = serde_json::from_value(object)
                .map_err(|error| format!("data.object is not a refund: {error}"))?;
            let provider_refund = body.to_refund().map_err(|error| format!("data.object: {error}"))?;
            Object::Refund {
                refund: refund_of_downstream_key(&body.idempotency_key),
                id: body.id,
                provider_refund,
            }
        }
        event_type::DISPUTE_CREATED
        | event_type::DISPUTE_UPDATED
        | event_type::DISPUTE_FUNDS_WITHDRAWN
        | event_type::DISPUTE_FUNDS_REINSTATED
        | event_type::DISPUTE_CLOSED => {
            let body: DisputeBody = serde_json::from_value(object)
                .map_err(|error| format!("data.object is not a dispute: {error}"))?;
            let dispute = body.to_dispute().map_err(|error| format!("data.object: {error}"))?;
            Object::Dispute { dispute: Box::new(dispute) }
        }
        _ => {
            let id = object.get("id").and_then(serde_json::Value::as_str).unwrap_or_default();
            Object::Other { id: id.to_owned() }
        }
    };
    Ok(Event { id, kind: envelope.kind, object })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn charge_json() -> serde_json::Value {
        serde_json::json!({
            "id": "ch_1", "object": "charge", "idempotency_key": "k", "amount": "10.00",
            "currency": "USD", "status": "requires_capture", "captured": false,
            "amount_captured": "0.00", "amount_refunded": "0.00", "payment_method": "pm_card_ok",
            "reference": "r", "decline_code": null, "failure_message": null,
            "cancellation_reason": null, "authorization_expires_at": "2030-01-01T00:00:00Z",
            "created_at": "2029-12-25T00:00:00Z"
        })
    }

    fn refund_json() -> serde_json::Value {
        serde_json::json!({
            "id": "re_1", "object": "refund", "idempotency_key": "k", "charge": "ch_1",
            "amount": "2.50", "currency": "USD", "status": "failed", "reference": "r",
            "failure_code": "refund_declined", "failure_message": "no", "created_at": "2030-01-01T00:00:00Z"
        })
    }

    #[test]
    fn charges_and_refunds_translate_exactly() {
        let body: ChargeBody = serde_json::from_value(charge_json()).unwrap();
        let charge = body.to_charge().unwrap();
        assert_eq!(charge.status, ChargeStatus::RequiresCapture);
        assert_eq!(charge.amount, rust_decimal::Decimal::new(1000, 2));
        assert!(charge.amount_captured.is_zero());
        assert!(charge.authorization_expires_at.is_some());

        let refund: RefundBody = serde_json::from_value(refund_json()).unwrap();
        let refund = refund.to_refund().unwrap();
        assert_eq!(
            refund.status,
            RefundStatus::Failed { code: "refund_declined".into(), message: "no".into() }
        );
        assert_eq!(refund.amount, rust_decimal::Decimal::new(250, 2));
    }

    #[test]
    fn unknown_statuses_and_float_like_amounts_are_malformed() {
        let mut json = charge_json();
        json["status"] = "authorized".into();
        let body: ChargeBody = serde_json::from_value(json).unwrap();
        assert!(matches!(body.to_charge(), Err(ProviderError::Malformed(_))));
        let mut json = charge_json();
        json["amount_captured"] = "NaN".into();
        let body: ChargeBody = serde_json::from_value(json).unwrap();
        assert!(matches!(body.to_charge(), Err(ProviderError::Malformed(_))));
        // A JSON number where a decimal string belongs is refused outright.
        let mut json = refund_json();
        json["amount"] = serde_json::json!(2.5);
        assert!(serde_json::from_value::<RefundBody>(json).is_err());
    }

    #[test]
    fn an_event_object_is_told_apart_by_its_fields() {
        let event = |object: serde_json::Value| {
            serde_json::from_value::<EventBody>(serde_json::json!({
                "id": "evt_1", "type": "charge.succeeded", "created": 1, "data": { "object": object }
            }))
            .unwrap()
        };
        assert!(matches!(event(charge_json()).data.object, EventObject::Charge(_)));
        assert!(matches!(event(refund_json()).data.object, EventObject::Refund(_)));
        let dispute = serde_json::json!({
            "id": "dp_1", "object": "dispute", "charge": "ch_1", "amount": "10.00", "currency": "USD",
            "reason": "fraudulent", "status": "needs_response", "closed_reason": null,
            "evidence_due_by": "2030-01-08T00:00:00Z", "evidence": null, "submission_count": 0,
            "amount_withdrawn": "10.00", "amount_reinstated": "0.00", "created_at": "2030-01-01T00:00:00Z"
        });
        assert!(matches!(event(dispute).data.object, EventObject::Dispute(_)));
        // Serialised back, the object is exactly what was sent.
        let EventObject::Charge(charge) = event(charge_json()).data.object else { unreachable!() };
        assert_eq!(serde_json::to_value(charge).unwrap(), charge_json());
    }

    #[test]
    fn capture_defaults_to_true_and_error_codes_are_optional() {
        let body: CreateChargeBody = serde_json::from_value(serde_json::json!({
            "amount": "1.00", "currency": "USD", "payment_method": "pm_card_ok", "reference": "r"
        }))
        .unwrap();
        assert!(body.capture);
        let error: ErrorBody = serde_json::from_str(r#"{"error":{"type":"api_error"}}"#).unwrap();
        assert_eq!((error.error.code, error.error.message), (None, String::new()));
        let json = serde_json::to_string(&CaptureChargeBody::default()).unwrap();
        assert_eq!(json, "{}");
    }

    fn event(kind: &str, object: serde_json::Value) -> serde_json::Value {
        serde_json::json!({ "id": "evt_1", "type": kind, "created": 1, "data": { "object": object } })
    }

    #[test]
    fn known_event_types_need_their_object_and_others_are_tolerated() {
        let mut ours = charge_json();
        ours["idempotency_key"] = "orderpay_pay_0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b".into();
        ours["status"] = "succeeded".into();
        ours["captured"] = true.into();
        ours["amount_captured"] = "10.00".into();
        let read = read_event("evt_1".into(), event("charge.succeeded", ours)).unwrap();
        let Object::Charge { payment: Some(payment), ref charge, .. } = read.object else {
            panic!("{read:?}")
        };
        assert_eq!(payment.to_string(), "0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b");
        assert_eq!(charge.status, ChargeStatus::Succeeded);
        assert_eq!(read.object_id(), "ch_1");
        let not_ours = read_event("evt_1".into(), event("charge.succeeded", charge_json())).unwrap();
        assert!(matches!(not_ours.object, Object::Charge { payment: None, .. }), "{not_ours:?}");

        // A charge event whose object is no charge, or whose status we cannot read.
        assert!(
            read_event("evt_1".into(), event("charge.failed", serde_json::json!({"id": "re_1"}))).is_err()
        );
        let mut unknown_status = charge_json();
        unknown_status["status"] = "authorized".into();
        assert!(read_event("evt_1".into(), event("charge.succeeded", unknown_status)).is_err());
        assert!(read_event("evt_1".into(), event("refund.succeeded", charge_json())).is_err());
        // Not an event at all, or a type that cannot be stored.
        assert!(read_event("evt_1".into(), serde_json::json!({"hello": "world"})).is_err());
        assert!(read_event("evt_1".into(), event("", charge_json())).is_err());
        assert!(read_event("evt_1".into(), event("has space", charge_json())).is_err());

        let other = read_event("evt_2".into(), event("customer.created", serde_json::json!({"id": "cus_1"})))
            .unwrap();
        assert!(matches!(other.object, Object::Other { ref id } if id == "cus_1"));
        let odd_id =
            read_event("evt_3".into(), event("payout.paid", serde_json::json!({"id": "a\u{0}b"}))).unwrap();
        assert_eq!(odd_id.object_id(), "", "an id that cannot be stored as text is left out");
    }
}
