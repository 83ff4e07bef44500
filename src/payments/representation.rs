//! The public representation of a payment and of its final answers.
//!
//! It lives with the domain, not in `http`, because a payment's final answer is also produced
//! outside any request: the reconciler settles a payment and stores the answer for its
//! idempotency key, which a client retry then replays. Both paths must render the same bytes.

use chrono::{DateTime, Utc};
use serde::Serialize;
use uuid::Uuid;

use super::{Payment, PaymentStatus};
use crate::error::ApiError;
use crate::idempotency::StoredResponse;
use crate::money::Amount;

#[derive(Serialize)]
struct PaymentResource<'a> {
    id: Uuid,
    object: &'static str,
    order_id: Uuid,
    status: &'static str,
    amount: Amount,
    currency: &'static str,
    payment_method: &'a str,
    provider_charge_id: Option<&'a str>,
    failure_code: Option<&'a str>,
    failure_message: Option<&'a str>,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
}

/// The payment as JSON.
pub fn payment_json(payment: &Payment) -> Vec<u8> {
    let resource = PaymentResource {
        id: payment.id,
        object: "payment",
        order_id: payment.order_id,
        status: payment.status.as_str(),
        amount: payment.amount,
        currency: payment.amount.currency().code(),
        payment_method: &payment.payment_method,
        provider_charge_id: payment.provider_charge_id.as_deref(),
        failure_code: payment.failure_code.as_deref(),
        failure_message: payment.failure_message.as_deref(),
        created_at: payment.created_at,
        updated_at: payment.updated_at,
    };
    // Serialising our own plain struct cannot fail.
    serde_json::to_vec(&resource).unwrap_or_default()
}

pub fn location(payment: &Payment) -> String {
    format!("/payments/{}", payment.id)
}

/// The answer for a payment whose outcome is known: 201 with the payment when it succeeded,
/// 402 problem+json when it failed. Stored with the key and replayed.
pub fn final_response(payment: &Payment) -> StoredResponse {
    match payment.status {
        PaymentStatus::Succeeded | PaymentStatus::Processing => {
            StoredResponse::json(201, payment_json(payment)).with_header("location", location(payment))
        }
        PaymentStatus::Failed => failure(payment).to_stored_response(),
    }
}

/// The problem a failed payment answers with.
pub fn failure(payment: &Payment) -> ApiError {
    let code = payment.failure_code.clone().unwrap_or_else(|| "failed".to_owned());
    let message = payment.failure_message.clone().unwrap_or_else(|| "the payment failed".to_owned());
    if code == super::service::GAVE_UP_CODE {
        ApiError::PaymentFailed { payment_id: payment.id, reason: message }
    } else {
        ApiError::PaymentDeclined { payment_id: payment.id, code, message }
    }
}
