//! Stripe's objects as its answers spell them (PaymentIntent, Charge, Refund, Dispute,
//! BalanceTransaction, lists) and their translation into the provider trait's types: integer
//! minor units into major-unit decimals by `amount`'s table, lower-case currencies into ISO
//! codes, unix seconds into times, and Stripe's statuses into ours (docs/providers.md).
//!
//! Only the fields orderpay reads are declared; the rest of an answer is ignored. Fields a
//! Stripe stand-in may leave out (localstripe has no `amount_received`, `amount_captured` or
//! `cancellation_reason`) are optional, with the fallback each one says.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use rust_decimal::Decimal;
use serde::Deserialize;

use super::amount::from_minor_units;
use super::form::{PAYMENT_ID_METADATA, REFUND_ID_METADATA};
use crate::disputes::{ClosedReason, DisputeStatus};
use crate::ids::{PaymentId, RefundId};
use crate::money::Currency;
use crate::provider::{
    BalanceTransaction, Charge, ChargeStatus, Dispute, ProviderError, Refund, RefundStatus,
};
use crate::{payments, refunds};

/// The decline code of a PaymentIntent that needed the customer (3-D Secure, another payment
/// method) after its confirmation: orderpay confirms server-side with no customer present, so it
/// is a decline, and the PaymentIntent is cancelled.
pub const AUTHENTICATION_REQUIRED: &str = "authentication_required";

/// A field Stripe answers either as an id or, expanded, as the object.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Expandable<T> {
    Id(String),
    Object(Box<T>),
}

/// A page of a list (`GET /v1/payment_intents`, `/v1/refunds`, ...).
#[derive(Debug, Clone, Deserialize)]
pub struct List<T> {
    pub data: Vec<T>,
    #[serde(default)]
    pub has_more: bool,
}

#[derive(Debug, Clone, Deserialize)]
pub struct PaymentIntentObject {
    pub id: String,
    pub status: String,
    pub amount: i64,
    pub currency: String,
    /// What was captured; absent on localstripe (then read from the latest charge).
    #[serde(default)]
    pub amount_received: Option<i64>,
    #[serde(default)]
    pub cancellation_reason: Option<String>,
    #[serde(default)]
    pub latest_charge: Option<Expandable<ChargeObject>>,
    #[serde(default)]
    pub last_payment_error: Option<PaymentError>,
    #[serde(default)]
    pub metadata: HashMap<String, String>,
    pub created: i64,
}

/// Why the last confirmation failed: a decline, or an authentication that failed.
#[derive(Debug, Clone, Deserialize)]
pub struct PaymentError {
    #[serde(default)]
    pub code: Option<String>,
    #[serde(default)]
    pub decline_code: Option<String>,
    #[serde(default)]
    pub message: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct ChargeObject {
    pub amount: i64,
    /// Absent on localstripe: then all of `amount` once `captured`.
    #[serde(default)]
    pub amount_captured: Option<i64>,
    #[serde(default)]
    pub captured: bool,
    /// `succeeded`, `pending` or `failed`: a failed charge captured nothing, whatever `captured`
    /// says (localstripe marks a declined automatic charge captured).
    #[serde(default)]
    pub status: Option<String>,
    /// Counts pending refunds too, as the trait's `amount_refunded` wants.
    #[serde(default)]
    pub amount_refunded: i64,
    #[serde(default)]
    pub payment_method_details: Option<PaymentMethodDetails>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct PaymentMethodDetails {
    #[serde(default)]
    pub card: Option<CardDetails>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct CardDetails {
    /// When an uncaptured authorization lapses (unix seconds).
    #[serde(default)]
    pub capture_before: Option<i64>,
}

fn malformed(what: impl std::fmt::Display) -> ProviderError {
    ProviderError::Malformed(what.to_string())
}

/// Stripe's lower-case currency as the ISO code orderpay holds.
fn currency(text: &str) -> Result<Currency, ProviderError> {
    Currency::parse(&text.to_ascii_uppercase())
        .map_err(|error| malformed(format!("currency {text:?}: {error}")))
}

/// Stripe's integer `minor_units` in `currency`, in major units.
fn major(minor_units: i64, currency: Currency) -> Result<Decimal, ProviderError> {
    from_minor_units(minor_units, currency).map(|amount| amount.value()).map_err(malformed)
}

fn time(unix: i64) -> Result<DateTime<Utc>, ProviderError> {
    DateTime::from_timestamp(unix, 0).ok_or_else(|| malformed(format!("{unix} is not a time")))
}

impl PaymentIntentObject {
    /// The id of our payment it was created for (`metadata[orderpay_payment_id]`).
    pub fn payment_reference(&self) -> Option<&str> {
        self.metadata.get(PAYMENT_ID_METADATA).map(String::as_str)
    }

    /// Whether confirming it left it waiting for the customer: orderpay cancels it and counts it
    /// a decline ([`AUTHENTICATION_REQUIRED`]).
    pub fn needs_the_customer(&self) -> bool {
        self.status == "requires_action"
            || (self.status == "requires_payment_method" && self.last_payment_error.is_none())
    }

    /// The trait's view of this PaymentIntent. Its latest charge must be expanded (every call
    /// asks for it): that is where captured and refunded amounts are read.
    pub fn to_charge(&self) -> Result<Charge, ProviderError> {
        if let Some(Expandable::Id(id)) = &self.latest_charge {
            return Err(malformed(format!("{}'s latest charge {id} was not expanded", self.id)));
        }
        self.to_event_charge()
    }

    /// The trait's view of this PaymentIntent as a webhook event carries it: Stripe sends the
    /// latest charge there as an id, so what was refunded (zero here) and when an authorization
    /// lapses (none) are not known from the event. That is enough to tell when to ask: the
    /// engine never settles on an event's word, it looks the PaymentIntent up first (expanded).
    pub fn to_event_charge(&self) -> Result<Charge, ProviderError> {
        let currency = currency(&self.currency)?;
        let latest = match &self.latest_charge {
            Some(Expandable::Object(charge)) => Some(charge.as_ref()),
            Some(Expandable::Id(_)) | None => None,
        };
        let captured = match (self.amount_received, latest) {
            (Some(received), _) => received,
            (None, Some(charge)) if charge.captured && charge.status.as_deref() == Some("succeeded") => {
                charge.amount_captured.unwrap_or(charge.amount)
            }
            (None, _) => 0,
        };
        let refunded = latest.map_or(0, |charge| charge.amount_refunded);
        let status = self.status(self.latest_charge.is_some())?;
        let authorization_expires_at = latest
            .and_then(|charge| charge.payment_method_details.as_ref()?.card.as_ref()?.capture_before)
            .map(time)
            .transpose()?;
        Ok(Charge {
            id: self.id.clone(),
            status,
            currency: currency.code().to_owned(),
            amount: major(self.amount, currency)?,
            amount_captured: major(captured, currency)?,
            amount_refunded: major(refunded, currency)?,
            authorization_expires_at,
        })
    }

    fn status(&self, has_charge: bool) -> Result<ChargeStatus, ProviderError> {
        Ok(match self.status.as_str() {
            "succeeded" => ChargeStatus::Succeeded,
            "requires_capture" => ChargeStatus::RequiresCapture,
            "processing" => ChargeStatus::Pending,
            // Confirmed server-side, so waiting for the customer is a decline; a failed
            // confirmation says why in `last_payment_error`.
            "requires_action" | "requires_payment_method" => self.declined(),
            // Cancelled before any charge existed: never authorized, so what orderpay cancelled
            // after a confirmation that needed the customer (a decline to us). With a charge,
            // an authorization that was voided or lapsed.
            "canceled" if !has_charge => self.declined(),
            "canceled" => ChargeStatus::Canceled { reason: self.canceled_reason().to_owned() },
            other => {
                return Err(malformed(format!("PaymentIntent {} is {other:?} after confirmation", self.id)));
            }
        })
    }

    fn declined(&self) -> ChargeStatus {
        let error = self.last_payment_error.as_ref();
        let code = error
            .and_then(|error| error.decline_code.clone().or_else(|| error.code.clone()))
            .unwrap_or_else(|| AUTHENTICATION_REQUIRED.to_owned());
        let message = error
            .and_then(|error| error.message.clone())
            .unwrap_or_else(|| "the payment needs the customer to authenticate".to_owned());
        ChargeStatus::Declined { code, message }
    }

    /// Stripe's `cancellation_reason` in the trait's words: `automatic` is Stripe letting the
    /// authorization lapse; anything else (ours is none) a void.
    fn canceled_reason(&self) -> &'static str {
        match self.cancellation_reason.as_deref() {
            Some("automatic") => "authorization_expired",
            _ => "requested",
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
pub struct RefundObject {
    pub id: String,
    pub amount: i64,
    pub currency: String,
    pub status: String,
    #[serde(default)]
    pub payment_intent: Option<String>,
    #[serde(default)]
    pub charge: Option<String>,
    #[serde(default)]
    pub failure_reason: Option<String>,
    #[serde(default)]
    pub metadata: HashMap<String, String>,
    pub created: i64,
}

impl RefundObject {
    /// The id of our refund it was created for (`metadata[orderpay_refund_id]`).
    pub fn refund_reference(&self) -> Option<&str> {
        self.metadata.get(REFUND_ID_METADATA).map(String::as_str)
    }

    pub fn to_refund(&self) -> Result<Refund, ProviderError> {
        let currency = currency(&self.currency)?;
        let status = match self.status.as_str() {
            "succeeded" => RefundStatus::Succeeded,
            // `requires_action`: Stripe waits for the customer's bank details; money still due.
            "pending" | "requires_action" => RefundStatus::Pending,
            "failed" | "canceled" => {
                let code = self.failure_reason.clone().unwrap_or_else(|| self.status.clone());
                RefundStatus::Failed { code, message: format!("the refund {}", self.status) }
            }
            other => return Err(malformed(format!("refund {} is {other:?}", self.id))),
        };
        // Our charge ids are PaymentIntents'; a refund made through a charge names only that.
        let charge_id = self
            .payment_intent
            .clone()
            .or_else(|| self.charge.clone())
            .ok_or_else(|| malformed(format!("refund {} names no PaymentIntent", self.id)))?;
        Ok(Refund {
            id: self.id.clone(),
            charge_id,
            status,
            currency: currency.code().to_owned(),
            amount: major(self.amount, currency)?,
        })
    }
}

#[derive(Debug, Clone, Deserialize)]
pub struct DisputeObject {
    pub id: String,
    pub amount: i64,
    pub currency: String,
    pub charge: String,
    #[serde(default)]
    pub payment_intent: Option<String>,
    pub reason: String,
    pub status: String,
    #[serde(default)]
    pub evidence: DisputeEvidence,
    #[serde(default)]
    pub evidence_details: EvidenceDetails,
    #[serde(default)]
    pub balance_transactions: Vec<DisputeMovement>,
    pub created: i64,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct DisputeEvidence {
    /// Where orderpay's text evidence goes.
    #[serde(default)]
    pub uncategorized_text: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct EvidenceDetails {
    #[serde(default)]
    pub due_by: Option<i64>,
    #[serde(default)]
    pub submission_count: u32,
}

/// A movement of the dispute's money: negative when withdrawn, positive when reinstated.
#[derive(Debug, Clone, Deserialize)]
pub struct DisputeMovement {
    pub amount: i64,
}

impl DisputeObject {
    /// The trait's view. Stripe's statuses are the trait's; Stripe gives no reason for a close,
    /// so it is inferred: evidence submitted means the network decided, none means it was lost
    /// without evidence (a dispute orderpay accepted reads the same until [`Self::accepted`]).
    pub fn to_dispute(&self) -> Result<Dispute, ProviderError> {
        let currency = currency(&self.currency)?;
        let status = DisputeStatus::parse(&self.status)
            .ok_or_else(|| malformed(format!("dispute {} is {:?}", self.id, self.status)))?;
        let closed_reason = status.is_final().then_some(if self.evidence_details.submission_count > 0 {
            ClosedReason::Decided
        } else {
            ClosedReason::EvidenceNotSubmitted
        });
        let sum = |keep: fn(i64) -> bool| -> i64 {
            self.balance_transactions
                .iter()
                .map(|movement| movement.amount)
                .filter(|amount| keep(*amount))
                .sum()
        };
        Ok(Dispute {
            id: self.id.clone(),
            // Our charge ids are PaymentIntents'.
            charge_id: self.payment_intent.clone().unwrap_or_else(|| self.charge.clone()),
            amount: major(self.amount, currency)?,
            currency: currency.code().to_owned(),
            reason: self.reason.clone(),
            status,
            closed_reason,
            closed_reason_inferred: status.is_final(),
            evidence_due_by: self.evidence_details.due_by.map(time).transpose()?,
            evidence: self.evidence.uncategorized_text.clone(),
            submission_count: self.evidence_details.submission_count,
            amount_withdrawn: major(-sum(|amount| amount < 0), currency)?,
            amount_reinstated: major(sum(|amount| amount > 0), currency)?,
            created_at: time(self.created)?,
        })
    }

    /// The dispute as `POST /v1/disputes/{id}/close` answered it: closed because we accepted.
    pub fn accepted(&self) -> Result<Dispute, ProviderError> {
        let dispute = self.to_dispute()?;
        let closed_reason = dispute.status.is_final().then_some(ClosedReason::Accepted);
        Ok(Dispute { closed_reason, closed_reason_inferred: false, ..dispute })
    }
}

#[derive(Debug, Clone, Deserialize)]
pub struct BalanceTransactionObject {
    pub id: String,
    /// Signed minor units: negative when money left the balance.
    pub amount: i64,
    pub currency: String,
    pub reporting_category: String,
    /// The charge, refund or dispute that moved it; expanded, so that the PaymentIntent and our
    /// metadata can be read from it.
    #[serde(default)]
    pub source: Option<Expandable<SourceObject>>,
    pub created: i64,
}

/// What a balance transaction's expanded `source` says of itself: a charge, a refund or a
/// dispute, each with its PaymentIntent (expanded too: `data.source.payment_intent`) and
/// metadata when it has them.
#[derive(Debug, Clone, Deserialize)]
pub struct SourceObject {
    pub id: String,
    #[serde(default)]
    pub object: Option<String>,
    #[serde(default)]
    pub payment_intent: Option<Expandable<PaymentIntentRef>>,
    #[serde(default)]
    pub metadata: HashMap<String, String>,
}

/// A source's PaymentIntent, expanded: its id and our metadata on it. A dispute carries nothing
/// of ours but its PaymentIntent, so this is where a dispute's movement finds our payment.
#[derive(Debug, Clone, Deserialize)]
pub struct PaymentIntentRef {
    pub id: String,
    #[serde(default)]
    pub metadata: HashMap<String, String>,
}

impl SourceObject {
    fn payment_intent_id(&self) -> Option<&str> {
        self.payment_intent.as_ref().map(|intent| match intent {
            Expandable::Id(id) => id.as_str(),
            Expandable::Object(intent) => intent.id.as_str(),
        })
    }

    /// Our payment's id: on the source (Stripe copies a PaymentIntent's metadata to its
    /// charge), else on its expanded PaymentIntent (a dispute's only link to us).
    fn payment_reference(&self) -> Option<&str> {
        let on_intent = match &self.payment_intent {
            Some(Expandable::Object(intent)) => intent.metadata.get(PAYMENT_ID_METADATA),
            _ => None,
        };
        self.metadata.get(PAYMENT_ID_METADATA).or(on_intent).map(String::as_str)
    }
}

impl BalanceTransactionObject {
    /// The trait's view. `source` is the PaymentIntent for a charge or a dispute (our charge
    /// ids), the refund's id for a refund. `source_key` is the downstream key rebuilt from our
    /// metadata: a refund's `orderpay_refund_id`, a charge's `orderpay_payment_id` (on the charge,
    /// where Stripe copies the PaymentIntent's metadata, or on its expanded PaymentIntent), a
    /// dispute's from its expanded PaymentIntent (the dispute itself carries none of ours).
    pub fn to_balance_transaction(&self) -> Result<BalanceTransaction, ProviderError> {
        let currency = currency(&self.currency)?;
        let magnitude =
            major(self.amount.checked_abs().ok_or_else(|| malformed("amount out of range"))?, currency)?;
        let amount = if self.amount < 0 { -magnitude } else { magnitude };
        let (source, source_key) = match &self.source {
            None => return Err(malformed(format!("balance transaction {} has no source", self.id))),
            Some(Expandable::Id(id)) => (id.clone(), None),
            Some(Expandable::Object(source)) => {
                let is_refund = source.object.as_deref() == Some("refund");
                let id = match (source.payment_intent_id(), is_refund) {
                    (Some(payment_intent), false) => payment_intent.to_owned(),
                    _ => source.id.clone(),
                };
                let key = if is_refund {
                    source
                        .metadata
                        .get(REFUND_ID_METADATA)
                        .and_then(|id| RefundId::parse(id))
                        .map(refunds::downstream_key)
                } else {
                    source.payment_reference().and_then(PaymentId::parse).map(payments::downstream_key)
                };
                (id, key)
            }
        };
        Ok(BalanceTransaction {
            id: self.id.clone(),
            category: self.reporting_category.clone(),
            amount,
            currency: currency.code().to_owned(),
            source,
            source_key,
            created: time(self.created)?,
        })
    }
}

/// The error body of a 402 decline: the PaymentIntent it left behind, when Stripe names it.
#[derive(Debug, Default, Deserialize)]
pub struct DeclineEnvelope {
    #[serde(default)]
    pub error: DeclineBody,
}

#[derive(Debug, Default, Deserialize)]
pub struct DeclineBody {
    #[serde(default)]
    pub payment_intent: Option<Expandable<IdOnly>>,
    /// localstripe names the failed charge only.
    #[serde(default)]
    pub charge: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct IdOnly {
    pub id: String,
}

impl DeclineEnvelope {
    /// The id of what the decline left at Stripe: its PaymentIntent, else its charge.
    pub fn object_id(&self) -> Option<String> {
        match &self.error.payment_intent {
            Some(Expandable::Object(intent)) => Some(intent.id.clone()),
            Some(Expandable::Id(id)) => Some(id.clone()),
            None => self.error.charge.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn intent(value: serde_json::Value) -> PaymentIntentObject {
        serde_json::from_value(value).unwrap()
    }

    fn charge(captured: bool, amount_captured: i64, amount_refunded: i64) -> serde_json::Value {
        json!({"id": "ch_1", "object": "charge", "amount": 1234, "amount_captured": amount_captured,
               "captured": captured, "amount_refunded": amount_refunded, "status": "succeeded",
               "payment_method_details": {"card": {"capture_before": 1_750_600_000}}})
    }

    fn payment_intent(status: &str, latest_charge: serde_json::Value) -> serde_json::Value {
        json!({"id": "pi_1", "object": "payment_intent", "status": status, "amount": 1234,
               "amount_received": 0, "currency": "eur", "cancellation_reason": null,
               "latest_charge": latest_charge, "created": 1_750_000_000,
               "metadata": {"orderpay_payment_id": "01900000-0000-7000-8000-000000000001"}})
    }

    fn decimal(text: &str) -> Decimal {
        text.parse().unwrap()
    }

    #[test]
    fn a_succeeded_payment_intent_is_a_captured_charge_in_major_units_with_its_refunds() {
        let mut value = payment_intent("succeeded", charge(true, 1234, 234));
        value["amount_received"] = json!(1234);
        let charge = intent(value).to_charge().unwrap();
        assert_eq!(charge.id, "pi_1");
        assert_eq!(charge.status, ChargeStatus::Succeeded);
        assert_eq!(charge.currency, "EUR");
        assert_eq!(
            (charge.amount, charge.amount_captured, charge.amount_refunded),
            (decimal("12.34"), decimal("12.34"), decimal("2.34"))
        );
        let reference = intent(payment_intent("succeeded", json!(null)));
        assert_eq!(reference.payment_reference(), Some("01900000-0000-7000-8000-000000000001"));
    }

    #[test]
    fn an_authorization_says_when_it_lapses_and_captures_nothing_yet() {
        let charge = intent(payment_intent("requires_capture", charge(false, 0, 0))).to_charge().unwrap();
        assert_eq!(charge.status, ChargeStatus::RequiresCapture);
        assert_eq!(charge.amount_captured, Decimal::ZERO);
        assert_eq!(charge.authorization_expires_at, DateTime::from_timestamp(1_750_600_000, 0));
        let processing = intent(payment_intent("processing", json!(null))).to_charge().unwrap();
        assert_eq!(processing.status, ChargeStatus::Pending);
    }

    #[test]
    fn without_amount_received_the_captured_amount_is_read_from_the_charge() {
        // localstripe's shape: no amount_received on the PaymentIntent, no amount_captured on
        // its charge.
        let mut value = payment_intent(
            "succeeded",
            json!({"id": "ch_1", "amount": 1234, "captured": true, "amount_refunded": 0, "status": "succeeded"}),
        );
        value.as_object_mut().unwrap().remove("amount_received");
        assert_eq!(intent(value).to_charge().unwrap().amount_captured, decimal("12.34"));
        // A declined charge captured nothing, though localstripe marks it captured.
        let mut declined = payment_intent(
            "requires_payment_method",
            json!({"id": "ch_1", "amount": 1234, "captured": true, "amount_refunded": 0, "status": "failed"}),
        );
        declined.as_object_mut().unwrap().remove("amount_received");
        declined["last_payment_error"] = json!({"code": "card_declined", "message": "declined"});
        assert_eq!(intent(declined).to_charge().unwrap().amount_captured, Decimal::ZERO);
    }

    #[test]
    fn a_payment_intent_that_needs_the_customer_or_failed_its_confirmation_is_a_decline() {
        let needs_action = intent(payment_intent("requires_action", json!(null)));
        assert!(needs_action.needs_the_customer());
        assert_eq!(
            needs_action.to_charge().unwrap().status,
            ChargeStatus::Declined {
                code: AUTHENTICATION_REQUIRED.into(),
                message: "the payment needs the customer to authenticate".into()
            }
        );
        let mut failed = payment_intent("requires_payment_method", json!(null));
        failed["last_payment_error"] = json!({"type": "card_error", "code": "card_declined", "decline_code": "insufficient_funds", "message": "no"});
        let failed = intent(failed);
        assert!(!failed.needs_the_customer(), "a decline is not cancelled, it is answered");
        assert_eq!(
            failed.to_charge().unwrap().status,
            ChargeStatus::Declined { code: "insufficient_funds".into(), message: "no".into() }
        );
        // Cancelled before any charge (orderpay's cancel of one that needed the customer): a
        // decline; cancelled with a charge, a voided or lapsed authorization.
        let abandoned = intent(payment_intent("canceled", json!(null))).to_charge().unwrap();
        assert!(
            matches!(abandoned.status, ChargeStatus::Declined { code, .. } if code == AUTHENTICATION_REQUIRED)
        );
        let voided = intent(payment_intent("canceled", charge(false, 0, 0))).to_charge().unwrap();
        assert_eq!(voided.status, ChargeStatus::Canceled { reason: "requested".into() });
        let mut lapsed = payment_intent("canceled", charge(false, 0, 0));
        lapsed["cancellation_reason"] = json!("automatic");
        assert_eq!(
            intent(lapsed).to_charge().unwrap().status,
            ChargeStatus::Canceled { reason: "authorization_expired".into() }
        );
    }

    #[test]
    fn answers_orderpay_cannot_read_are_malformed_never_guessed() {
        let unexpanded = intent(payment_intent("succeeded", json!("ch_1"))).to_charge().unwrap_err();
        assert!(
            matches!(unexpanded, ProviderError::Malformed(ref text) if text.contains("not expanded")),
            "{unexpanded:?}"
        );
        let unconfirmed =
            intent(payment_intent("requires_confirmation", json!(null))).to_charge().unwrap_err();
        assert!(matches!(unconfirmed, ProviderError::Malformed(_)), "{unconfirmed:?}");
        let mut unknown_currency = payment_intent("succeeded", json!(null));
        unknown_currency["currency"] = json!("xxx");
        assert!(matches!(intent(unknown_currency).to_charge(), Err(ProviderError::Malformed(_))));
        let mut fractional_kronur = payment_intent("succeeded", json!(null));
        fractional_kronur["currency"] = json!("isk");
        fractional_kronur["amount"] = json!(150);
        assert!(matches!(intent(fractional_kronur).to_charge(), Err(ProviderError::Malformed(_))));
    }

    fn refund(status: &str) -> RefundObject {
        serde_json::from_value(json!({"id": "re_1", "object": "refund", "amount": 500, "currency": "jpy",
            "status": status, "payment_intent": "pi_1", "charge": "ch_1", "failure_reason": null,
            "metadata": {"orderpay_refund_id": "01900000-0000-7000-8000-000000000002"}, "created": 1_750_000_000}))
        .unwrap()
    }

    #[test]
    fn refunds_name_their_payment_intent_and_map_their_statuses() {
        let succeeded = refund("succeeded").to_refund().unwrap();
        assert_eq!(
            succeeded,
            Refund {
                id: "re_1".into(),
                charge_id: "pi_1".into(),
                status: RefundStatus::Succeeded,
                currency: "JPY".into(),
                amount: decimal("500")
            }
        );
        assert_eq!(refund("succeeded").refund_reference(), Some("01900000-0000-7000-8000-000000000002"));
        assert_eq!(refund("pending").to_refund().unwrap().status, RefundStatus::Pending);
        assert_eq!(refund("requires_action").to_refund().unwrap().status, RefundStatus::Pending);
        assert!(
            matches!(refund("canceled").to_refund().unwrap().status, RefundStatus::Failed { code, .. } if code == "canceled")
        );
        let mut failed = refund("failed");
        failed.failure_reason = Some("expired_or_canceled_card".into());
        assert!(
            matches!(failed.to_refund().unwrap().status, RefundStatus::Failed { code, .. } if code == "expired_or_canceled_card")
        );
        assert!(matches!(refund("weird").to_refund(), Err(ProviderError::Malformed(_))));
    }

    fn dispute(status: &str, submissions: u32) -> DisputeObject {
        serde_json::from_value(json!({"id": "du_1", "object": "dispute", "amount": 1000, "currency": "usd",
            "charge": "ch_1", "payment_intent": "pi_1", "reason": "fraudulent", "status": status,
            "evidence": {"uncategorized_text": "receipt", "customer_name": null},
            "evidence_details": {"due_by": 1_750_900_000, "submission_count": submissions, "has_evidence": true},
            "balance_transactions": [{"id": "txn_1", "amount": -1000, "fee": 1500}, {"id": "txn_2", "amount": 1000, "fee": -1500}],
            "created": 1_750_000_000}))
        .unwrap()
    }

    #[test]
    fn disputes_map_their_evidence_movements_and_how_they_closed() {
        let open = dispute("needs_response", 0).to_dispute().unwrap();
        assert_eq!(open.charge_id, "pi_1");
        assert_eq!((open.amount, open.currency.as_str()), (decimal("10"), "USD"));
        assert_eq!(open.status, DisputeStatus::NeedsResponse);
        assert_eq!(open.closed_reason, None);
        assert_eq!(open.evidence.as_deref(), Some("receipt"));
        assert_eq!(open.evidence_due_by, DateTime::from_timestamp(1_750_900_000, 0));
        assert_eq!((open.amount_withdrawn, open.amount_reinstated), (decimal("10"), decimal("10")));
        assert_eq!(dispute("won", 1).to_dispute().unwrap().closed_reason, Some(ClosedReason::Decided));
        assert_eq!(
            dispute("lost", 0).to_dispute().unwrap().closed_reason,
            Some(ClosedReason::EvidenceNotSubmitted)
        );
        assert_eq!(dispute("lost", 0).accepted().unwrap().closed_reason, Some(ClosedReason::Accepted));
        assert!(matches!(dispute("prevented", 0).to_dispute(), Err(ProviderError::Malformed(_))));
    }

    fn movement(category: &str, amount: i64, source: serde_json::Value) -> BalanceTransaction {
        let object: BalanceTransactionObject =
            serde_json::from_value(json!({"id": "txn_1", "object": "balance_transaction",
            "amount": amount, "currency": "usd", "reporting_category": category, "source": source,
            "created": 1_750_000_000, "fee": 30}))
            .unwrap();
        object.to_balance_transaction().unwrap()
    }

    #[test]
    fn balance_transactions_are_signed_and_name_our_payment_or_refund_through_their_source() {
        let charge = movement(
            "charge",
            1234,
            json!({"id": "ch_1", "object": "charge", "payment_intent": "pi_1",
            "metadata": {"orderpay_payment_id": "01900000-0000-7000-8000-000000000001"}}),
        );
        assert_eq!((charge.amount, charge.source.as_str()), (decimal("12.34"), "pi_1"));
        assert_eq!(charge.source_key.as_deref(), Some("orderpay_pay_01900000-0000-7000-8000-000000000001"));
        assert_eq!(charge.category, "charge");
        let refund = movement(
            "refund",
            -500,
            json!({"id": "re_1", "object": "refund", "payment_intent": "pi_1",
            "metadata": {"orderpay_refund_id": "01900000-0000-7000-8000-000000000002"}}),
        );
        assert_eq!((refund.amount, refund.source.as_str()), (decimal("-5"), "re_1"));
        assert_eq!(
            refund.source_key.as_deref(),
            Some("orderpay_refund_01900000-0000-7000-8000-000000000002")
        );
        // A dispute names our payment only through its PaymentIntent, expanded; unexpanded, or a
        // charge without our metadata, names nothing.
        let dispute = movement(
            "dispute",
            -1000,
            json!({"id": "du_1", "object": "dispute", "payment_intent": {"id": "pi_1", "object": "payment_intent",
            "metadata": {"orderpay_payment_id": "01900000-0000-7000-8000-000000000001"}}}),
        );
        assert_eq!(dispute.source.as_str(), "pi_1");
        assert_eq!(dispute.source_key.as_deref(), Some("orderpay_pay_01900000-0000-7000-8000-000000000001"));
        let dispute =
            movement("dispute", -1000, json!({"id": "du_1", "object": "dispute", "payment_intent": "pi_1"}));
        assert_eq!((dispute.source.as_str(), dispute.source_key), ("pi_1", None));
        let unexpanded = movement("charge", 100, json!("ch_2"));
        assert_eq!((unexpanded.source.as_str(), unexpanded.source_key), ("ch_2", None));
    }

    #[test]
    fn a_decline_names_the_payment_intent_it_left_else_its_charge() {
        let stripe: DeclineEnvelope = serde_json::from_value(json!({"error": {"type": "card_error",
            "code": "card_declined", "payment_intent": {"id": "pi_9", "status": "requires_payment_method"}}}))
        .unwrap();
        assert_eq!(stripe.object_id().as_deref(), Some("pi_9"));
        let localstripe: DeclineEnvelope =
            serde_json::from_value(json!({"error": {"type": "invalid_request_error",
            "code": "card_declined", "charge": "ch_9"}}))
            .unwrap();
        assert_eq!(localstripe.object_id().as_deref(), Some("ch_9"));
    }
}
