//! Refunds: money given back on a payment that was captured. A refund is a provider operation
//! of its own (`processing` until the provider's outcome is known, then `succeeded` or
//! `failed`, both final), driven by the same engine as a payment's charge.
//!
//! The sum of a payment's succeeded and in-flight refunds never exceeds what it captured: a new
//! refund reserves its amount on the payment's row under the row's lock, and a CHECK constraint
//! backs the rule. The order goes `paid` -> `partially_refunded` -> `refunded`.

pub mod repository;
pub mod representation;
pub mod service;

use chrono::{DateTime, Utc};

use crate::ids::{AccountId, OrderId, PaymentId, RefundId};
use crate::money::Amount;
use crate::operations::leases::Lease;

crate::text_enum! {
    /// Refund lifecycle: `processing` until the outcome is known; the rest are final.
    pub enum RefundStatus {
        Processing = "processing",
        Succeeded = "succeeded",
        Failed = "failed",
    }
}

crate::text_enum! {
    /// Why the merchant gives the money back (as Stripe's refund reasons).
    pub enum RefundReason {
        RequestedByCustomer = "requested_by_customer",
        Duplicate = "duplicate",
        Fraudulent = "fraudulent",
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refund {
    pub id: RefundId,
    pub account_id: AccountId,
    pub payment_id: PaymentId,
    pub order_id: OrderId,
    pub status: RefundStatus,
    pub amount: Amount,
    pub reason: Option<RefundReason>,
    pub provider_refund_id: Option<String>,
    pub failure_code: Option<String>,
    pub failure_message: Option<String>,
    /// The client's key that asked for it; `None` for a refund the system started itself.
    pub idempotency_key: Option<String>,
    pub attempts: i32,
    pub lease: Option<Lease>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// What every downstream key of a refund starts with; the refund's id follows.
const DOWNSTREAM_KEY_PREFIX: &str = "orderpay_refund_";

impl Refund {
    /// The idempotency key of every provider call for this refund.
    pub fn downstream_key(&self) -> String {
        downstream_key(self.id)
    }
}

/// The idempotency key of every provider call for the refund `refund_id`.
pub fn downstream_key(refund_id: RefundId) -> String {
    format!("{DOWNSTREAM_KEY_PREFIX}{refund_id}")
}

/// The refund a downstream key names, if it is one of ours (a provider's webhook carries the
/// refund's key: how the refund is found without a scan).
pub fn refund_of_downstream_key(key: &str) -> Option<RefundId> {
    key.strip_prefix(DOWNSTREAM_KEY_PREFIX).and_then(RefundId::parse)
}
