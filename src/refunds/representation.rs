//! The public representation of a refund and of its final answers. Every driver of a refund
//! renders its answer here, so the request, a retry and the reconciler store the same bytes.

use chrono::{DateTime, Utc};
use serde::Serialize;
use uuid::Uuid;

use super::{Refund, RefundReason, RefundStatus};
use crate::error::ApiError;
use crate::idempotency::StoredResponse;
use crate::ids::{OrderId, PaymentId, RefundId};
use crate::money::Amount;
use crate::payments::GAVE_UP_CODE;

#[derive(Serialize)]
pub struct RefundResource<'a> {
    id: RefundId,
    object: &'static str,
    payment_id: PaymentId,
    order_id: OrderId,
    amount: Amount,
    currency: &'static str,
    status: RefundStatus,
    reason: Option<RefundReason>,
    provider_refund_id: Option<&'a str>,
    failure_code: Option<&'a str>,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
}

impl<'a> From<&'a Refund> for RefundResource<'a> {
    fn from(refund: &'a Refund) -> Self {
        RefundResource {
            id: refund.id,
            object: "refund",
            payment_id: refund.payment_id,
            order_id: refund.order_id,
            amount: refund.amount,
            currency: refund.amount.currency().code(),
            status: refund.status,
            reason: refund.reason,
            provider_refund_id: refund.provider_refund_id.as_deref(),
            failure_code: refund.failure_code.as_deref(),
            created_at: refund.created_at,
            updated_at: refund.updated_at,
        }
    }
}

/// The refund as JSON.
pub fn refund_json(refund: &Refund) -> Vec<u8> {
    // Serialising our own plain struct cannot fail.
    serde_json::to_vec(&RefundResource::from(refund)).unwrap_or_default()
}

/// The refund as JSON for the event of a correction (a refund given up on found carried out
/// late, or one reversed): the refund as GET returns it, with `"correction": true`.
pub fn correction_json(refund: &Refund) -> Vec<u8> {
    #[derive(Serialize)]
    struct Corrected<'a> {
        #[serde(flatten)]
        refund: RefundResource<'a>,
        correction: bool,
    }
    serde_json::to_vec(&Corrected { refund: RefundResource::from(refund), correction: true })
        .unwrap_or_default()
}

pub fn location(id: Uuid) -> String {
    format!("/refunds/{id}")
}

/// The answer for a refund whose outcome is known: 201 with the refund when it succeeded, 402
/// problem+json when it failed. Stored on the refund and replayed for its key.
pub fn final_response(refund: &Refund) -> StoredResponse {
    match refund.status {
        RefundStatus::Succeeded | RefundStatus::Processing => StoredResponse::json(201, refund_json(refund))
            .with_header("location", location(refund.id.as_uuid())),
        RefundStatus::Failed => failure(refund).to_stored_response(),
    }
}

/// 202 with the refund while its outcome is unknown (not stored).
pub fn pending_response(refund: &Refund) -> StoredResponse {
    StoredResponse::json(202, refund_json(refund)).with_header("location", location(refund.id.as_uuid()))
}

/// A stored answer with the headers that go with it: the same bytes [`final_response`] made.
pub fn stored_answer(id: Uuid, status: u16, body: Vec<u8>) -> StoredResponse {
    if (200..300).contains(&status) {
        StoredResponse::json(status, body).with_header("location", location(id))
    } else {
        StoredResponse { status, headers: vec![crate::error::problem_content_type()], body }
    }
}

/// The problem a failed refund answers with.
fn failure(refund: &Refund) -> ApiError {
    let code = refund.failure_code.clone().unwrap_or_else(|| "refund_failed".to_owned());
    let message = refund.failure_message.clone().unwrap_or_else(|| "the refund failed".to_owned());
    if code == GAVE_UP_CODE {
        ApiError::OperationFailed { operation: "refund", id: refund.id.as_uuid(), reason: message }
    } else {
        ApiError::RefundDeclined { refund_id: refund.id, code, message }
    }
}
