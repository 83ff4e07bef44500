//! Payments: the payment domain (types and state machine), its repository, its representation,
//! and the request flow of `POST /payments` (the service). Driving a payment at the provider and
//! settling it belong to the provider-operations engine (`crate::operations`), which the
//! request, a retry that takes a payment over, and the reconciler share.
//!
//! A payment is `processing` while its charge (or, for `capture_method: manual`, its
//! authorization) is unknown; then `succeeded` (captured), `requires_capture` (authorized,
//! waiting for a capture or a void) or `failed`. An authorization moves on by a capture
//! (`succeeded`) or a void or its expiry (`canceled`), showing `processing` while that operation's
//! outcome is unknown. `succeeded`, `failed` and `canceled` are terminal; refunds are operations
//! of their own and change only the refunded amount. Only a definite decline fails a payment:
//! a timeout, a 5xx, a refused or broken connection, or a `pending` charge leave it `processing`
//! for a retry or the reconciler.

pub mod authorization;
pub mod inspect;
pub mod repository;
pub mod representation;
pub mod service;
pub mod watches;

use chrono::{DateTime, Utc};

use crate::ids::{AccountId, OrderId, PaymentId};
use crate::money::{Amount, Currency};
use crate::operations::leases::Lease;
use crate::provider::ChargeLookup;

crate::text_enum! {
    /// Payment lifecycle (see the module doc). Spelled as Stripe spells them.
    pub enum PaymentStatus {
        Processing = "processing",
        RequiresCapture = "requires_capture",
        Succeeded = "succeeded",
        Failed = "failed",
        Canceled = "canceled",
    }
}

crate::text_enum! {
    /// Whether the provider captures at once, or only authorizes until a capture.
    pub enum CaptureMethod {
        Automatic = "automatic",
        Manual = "manual",
    }
}

/// A payment method token as the provider issues them: `pm_` and 1 to 64 letters, digits or
/// underscores. Whether the provider knows it is the provider's call (an unknown one is declined).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PaymentMethod(String);

impl PaymentMethod {
    pub fn parse(text: &str) -> Result<Self, &'static str> {
        let valid = text.strip_prefix("pm_").is_some_and(|rest| {
            (1..=64).contains(&rest.len()) && rest.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
        });
        if valid {
            Ok(PaymentMethod(text.to_owned()))
        } else {
            Err("must be a payment method id such as \"pm_card_ok\"")
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Payment {
    pub id: PaymentId,
    pub account_id: AccountId,
    pub order_id: OrderId,
    pub status: PaymentStatus,
    pub amount: Amount,
    pub capture_method: CaptureMethod,
    /// Captured at the provider: the amount (automatic) or the capture's amount (manual).
    pub amount_captured: Amount,
    /// Refunds that succeeded.
    pub amount_refunded: Amount,
    /// What the customer's bank took back through disputes: withdrawn and not reinstated (a
    /// dispute open or lost). Not refundable.
    pub amount_disputed: Amount,
    /// When the provider lets an authorization go, if it said.
    pub authorization_expires_at: Option<DateTime<Utc>>,
    pub payment_method: String,
    pub provider_charge_id: Option<String>,
    pub failure_code: Option<String>,
    pub failure_message: Option<String>,
    /// The client's key that created the payment: its retries replay the payment's answer.
    pub idempotency_key: Option<String>,
    /// Reconciliation: checks made, the next one due, and what the last one saw.
    pub attempts: i32,
    pub next_check_at: Option<DateTime<Utc>>,
    pub last_error: Option<String>,
    /// Who drives the payment now, and until when (`None`: nobody; a retry or the reconciler
    /// may take it over).
    pub lease: Option<Lease>,
    /// When its charge was last sent, noted under the lease before it left.
    pub last_send_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

impl Payment {
    /// The idempotency key of every provider call for this payment.
    pub fn downstream_key(&self) -> String {
        downstream_key(self.id)
    }

    /// A lookup of its charge made no later than a few minutes after its last send: the
    /// drive's, whose miss is answered by a re-send with the same key (the provider replays a
    /// charge it made) or, at the last check, by a give-up that the late-charge watch follows.
    pub fn charge_lookup_since_sent(&self) -> ChargeLookup {
        ChargeLookup { downstream_key: self.downstream_key(), last_send_at: self.last_send_at }
    }

    /// A lookup of its charge however late the provider made it: the late-charge watch's, a
    /// webhook's verification, an operator's. These look for exactly the charge a provider
    /// acting late made, so the send time bounds nothing.
    pub fn charge_lookup(&self) -> ChargeLookup {
        ChargeLookup::by_key(self.downstream_key())
    }

    pub fn currency(&self) -> Currency {
        self.amount.currency()
    }

    /// What a capture may still take: the authorized amount while it waits for one.
    pub fn amount_capturable(&self) -> Amount {
        if self.status == PaymentStatus::RequiresCapture {
            self.amount
        } else {
            Amount::zero(self.currency())
        }
    }
}

/// What every downstream key of a payment starts with; the payment's id follows.
const DOWNSTREAM_KEY_PREFIX: &str = "orderpay_pay_";

pub fn downstream_key(payment_id: PaymentId) -> String {
    format!("{DOWNSTREAM_KEY_PREFIX}{payment_id}")
}

/// The payment a downstream key names, if it is one of ours (a provider's webhook carries the
/// charge's key: how the payment is found without a scan).
pub fn payment_of_downstream_key(key: &str) -> Option<PaymentId> {
    key.strip_prefix(DOWNSTREAM_KEY_PREFIX).and_then(PaymentId::parse)
}

/// The failure code of a payment the reconciler gave up on.
pub const GAVE_UP_CODE: &str = "reconciliation_gave_up";

/// The failure code of a payment an operator settled as failed by hand
/// (`orderpay payments resolve --as failed`).
pub const RESOLVED_FAILED_CODE: &str = "resolved_by_operator";

/// A payment for unit tests: 10.00 USD by `pm_card_ok`, its charge in flight.
#[cfg(test)]
pub(crate) fn in_flight_for_tests(capture_method: CaptureMethod) -> Payment {
    let usd = Currency::parse("USD").unwrap();
    Payment {
        id: PaymentId::generate(),
        account_id: AccountId::generate(),
        order_id: OrderId::generate(),
        status: PaymentStatus::Processing,
        amount: Amount::parse("10", usd).unwrap(),
        capture_method,
        amount_captured: Amount::zero(usd),
        amount_refunded: Amount::zero(usd),
        amount_disputed: Amount::zero(usd),
        authorization_expires_at: None,
        payment_method: "pm_card_ok".into(),
        provider_charge_id: None,
        failure_code: None,
        failure_message: None,
        idempotency_key: None,
        attempts: 0,
        next_check_at: None,
        last_error: None,
        lease: None,
        last_send_at: None,
        created_at: Utc::now(),
        updated_at: Utc::now(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_downstream_key_names_its_payment() {
        let id = PaymentId::generate();
        assert_eq!(payment_of_downstream_key(&downstream_key(id)), Some(id));
        for other in ["", "orderpay_pay_", "orderpay_pay_x", "orderpay_refund_0190", "evt_1"] {
            assert_eq!(payment_of_downstream_key(other), None, "{other}");
        }
        let refund_key = format!("orderpay_refund_{}", id);
        assert_eq!(payment_of_downstream_key(&refund_key), None);
    }

    #[test]
    fn payment_methods_are_provider_tokens() {
        assert!(PaymentMethod::parse("pm_card_ok").is_ok());
        for bad in ["", "pm_", "card", "pm_has space", "pm_ü", &format!("pm_{}", "x".repeat(65))] {
            assert!(PaymentMethod::parse(bad).is_err(), "{bad}");
        }
    }
}
