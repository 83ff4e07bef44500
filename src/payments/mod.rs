//! Payments: the payment domain (types, state machine, what a provider answer means), its
//! repository, its representation, and the two-phase service of IDEMPOTENCY.md and PAYMENTS.md.
//!
//! A payment is `processing` until its outcome is known, then `succeeded` or `failed`; both are
//! terminal. Only a definite decline fails a payment: a timeout, a 5xx, a refused or broken
//! connection, or a `pending` charge leave it `processing` for a retry or the reconciler.

pub mod repository;
pub mod representation;
pub mod service;

use std::fmt;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::money::Amount;
use crate::provider::{Charge, ChargeRequest, ChargeStatus, ProviderError};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PaymentStatus {
    Processing,
    Succeeded,
    Failed,
}

impl PaymentStatus {
    pub fn as_str(&self) -> &'static str {
        match self {
            PaymentStatus::Processing => "processing",
            PaymentStatus::Succeeded => "succeeded",
            PaymentStatus::Failed => "failed",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "processing" => Some(PaymentStatus::Processing),
            "succeeded" => Some(PaymentStatus::Succeeded),
            "failed" => Some(PaymentStatus::Failed),
            _ => None,
        }
    }
}

impl fmt::Display for PaymentStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
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
    pub id: Uuid,
    pub account_id: Uuid,
    pub order_id: Uuid,
    pub status: PaymentStatus,
    pub amount: Amount,
    pub payment_method: String,
    pub provider_charge_id: Option<String>,
    pub failure_code: Option<String>,
    pub failure_message: Option<String>,
    pub idempotency_key: Option<String>,
    pub attempts: i32,
    pub next_check_at: Option<DateTime<Utc>>,
    pub last_error: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

impl Payment {
    /// The idempotency key of every provider call for this payment.
    pub fn downstream_key(&self) -> String {
        downstream_key(self.id)
    }

    pub fn charge_request(&self, request_id: Option<&str>) -> ChargeRequest {
        ChargeRequest {
            downstream_key: self.downstream_key(),
            amount: self.amount,
            payment_method: self.payment_method.clone(),
            reference: self.id,
            capture: true,
            request_id: request_id.map(str::to_owned),
        }
    }
}

pub fn downstream_key(payment_id: Uuid) -> String {
    format!("orderpay_pay_{payment_id}")
}

/// What one provider answer means for a payment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Charged: the payment succeeds and the order is paid.
    Succeeded { charge_id: String },
    /// Definitely not charged: the payment fails, the order stays payable.
    Declined { code: String, message: String },
    /// We do not know (yet): the payment stays `processing`.
    Unknown { reason: String },
    /// The provider has no charge for the downstream key: it never received one, so nothing
    /// was charged. (Only a lookup answers this; a charge request never does.)
    NotReceived,
}

/// Maps a provider answer to an outcome. Exhaustive on purpose: a new provider error does not
/// compile until someone decides what it means for money.
pub fn outcome_of(answer: Result<Charge, ProviderError>) -> Outcome {
    match answer {
        Ok(Charge { id, status: ChargeStatus::Succeeded, .. }) => Outcome::Succeeded { charge_id: id },
        Ok(Charge { status: ChargeStatus::Declined { code, message }, .. }) => {
            Outcome::Declined { code, message }
        }
        Ok(Charge { id, status: ChargeStatus::Pending, .. }) => {
            Outcome::Unknown { reason: format!("charge {id} is pending at the provider") }
        }
        // Payments charge with `capture: true`, so neither can answer a payment; should one, it is
        // left to the reconciler rather than guessed at.
        Ok(Charge { id, status: ChargeStatus::RequiresCapture, .. }) => {
            Outcome::Unknown { reason: format!("charge {id} is only authorized at the provider") }
        }
        Ok(Charge { id, status: ChargeStatus::Canceled { reason }, .. }) => {
            Outcome::Unknown { reason: format!("charge {id} is canceled at the provider ({reason})") }
        }
        Err(error @ ProviderError::Timeout) => Outcome::Unknown { reason: error.to_string() },
        Err(error @ ProviderError::Connection(_)) => Outcome::Unknown { reason: error.to_string() },
        Err(error @ ProviderError::ServerError(_)) => Outcome::Unknown { reason: error.to_string() },
        // A refusal that is not a decline (a malformed request, a key conflict) is our bug or
        // theirs, not an answer about the card: it is retried and eventually given up on.
        Err(error @ ProviderError::Rejected { .. }) => Outcome::Unknown { reason: error.to_string() },
        Err(error @ ProviderError::Malformed(_)) => Outcome::Unknown { reason: error.to_string() },
        // Refusals answer captures, cancels and refunds, never a charge request.
        Err(error @ ProviderError::Refused { .. }) => Outcome::Unknown { reason: error.to_string() },
    }
}

/// The terminal state a payment is being moved to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Settlement {
    Succeeded { charge_id: String },
    Failed { code: String, message: String },
}

impl Settlement {
    pub fn status(&self) -> PaymentStatus {
        match self {
            Settlement::Succeeded { .. } => PaymentStatus::Succeeded,
            Settlement::Failed { .. } => PaymentStatus::Failed,
        }
    }
}

/// A status change the state machine does not allow: terminal states are absorbing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("payment {payment_id} is {current}; it cannot become {wanted}")]
pub struct IllegalTransition {
    pub payment_id: Uuid,
    pub current: PaymentStatus,
    pub wanted: PaymentStatus,
}

/// Who applied a transition, for the audit trail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Actor {
    Request,
    Reconciler,
}

impl Actor {
    pub fn as_str(&self) -> &'static str {
        match self {
            Actor::Request => "request",
            Actor::Reconciler => "reconciler",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_definite_decline_is_final_failure() {
        let charge = |status| {
            Ok(Charge {
                id: "ch_1".into(),
                status,
                amount: rust_decimal::Decimal::TEN,
                amount_captured: rust_decimal::Decimal::TEN,
                amount_refunded: rust_decimal::Decimal::ZERO,
                authorization_expires_at: None,
            })
        };
        assert_eq!(
            outcome_of(charge(ChargeStatus::Succeeded)),
            Outcome::Succeeded { charge_id: "ch_1".into() }
        );
        assert!(matches!(
            outcome_of(charge(ChargeStatus::Declined { code: "c".into(), message: "m".into() })),
            Outcome::Declined { .. }
        ));
        for unknown in [
            charge(ChargeStatus::Pending),
            Err(ProviderError::Timeout),
            Err(ProviderError::Connection("reset".into())),
            Err(ProviderError::ServerError(503)),
            Err(ProviderError::Rejected { status: 400, message: "bad".into() }),
            Err(ProviderError::Malformed("?".into())),
        ] {
            assert!(matches!(outcome_of(unknown), Outcome::Unknown { .. }));
        }
    }

    #[test]
    fn payment_methods_are_provider_tokens() {
        assert!(PaymentMethod::parse("pm_card_ok").is_ok());
        for bad in ["", "pm_", "card", "pm_has space", "pm_ü", &format!("pm_{}", "x".repeat(65))] {
            assert!(PaymentMethod::parse(bad).is_err(), "{bad}");
        }
    }
}
