//! The public representation of a dispute: `GET /disputes/{id}`, the list, and the `dispute.*`
//! events' data, so that all three carry the same bytes.

use chrono::{DateTime, Utc};
use serde::Serialize;
use uuid::Uuid;

use super::{ClosedReason, Dispute, DisputeStatus};
use crate::error::ApiError;
use crate::ids::{OrderId, PaymentId};
use crate::money::Amount;

#[derive(Serialize)]
pub struct DisputeResource<'a> {
    id: Uuid,
    object: &'static str,
    payment_id: PaymentId,
    order_id: OrderId,
    provider_dispute_id: &'a str,
    amount: Amount,
    currency: &'static str,
    reason: &'a str,
    status: DisputeStatus,
    closed_reason: Option<ClosedReason>,
    evidence_due_by: Option<DateTime<Utc>>,
    /// What the provider withdrew from the balance for it.
    amount_withdrawn: Amount,
    /// What it gave back (a won dispute).
    amount_reinstated: Amount,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
}

impl<'a> DisputeResource<'a> {
    pub fn of(dispute: &'a Dispute) -> Result<Self, ApiError> {
        let amount = |value| {
            Amount::from_decimal(value, dispute.currency)
                .map_err(|error| ApiError::Internal(anyhow::anyhow!("dispute {}: {error}", dispute.id)))
        };
        Ok(DisputeResource {
            id: dispute.id,
            object: "dispute",
            payment_id: dispute.payment_id,
            order_id: dispute.order_id,
            provider_dispute_id: &dispute.provider_dispute_id,
            amount: amount(dispute.amount)?,
            currency: dispute.currency.code(),
            reason: &dispute.reason,
            status: dispute.status,
            closed_reason: dispute.closed_reason,
            evidence_due_by: dispute.evidence_due_by,
            amount_withdrawn: amount(dispute.amount_withdrawn)?,
            amount_reinstated: amount(dispute.amount_reinstated)?,
            created_at: dispute.created_at,
            updated_at: dispute.updated_at,
        })
    }
}

/// The dispute as JSON (an event's data).
pub fn dispute_json(dispute: &Dispute) -> Result<Vec<u8>, ApiError> {
    // Serialising our own plain struct cannot fail.
    Ok(serde_json::to_vec(&DisputeResource::of(dispute)?).unwrap_or_default())
}
